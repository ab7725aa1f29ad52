"""Predicted against measured: per-stage action costs measured in a run, the simulator's
timeline from them, and the error of the prediction."""

from __future__ import annotations

import statistics
from collections import defaultdict

from ppx import schedules
from ppx.measure.spans import handoffs
from ppx.measure.unseen_comms import comms_unseen
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.sim.costs import REDUCE, split_first
from ppx.schedules.sim.memory import UNTIL, peak_held


def _mean(values) -> float:
    return statistics.fmean(values) if values else 0.0


def cost_samples(steps: list[dict], schedule: Schedule) -> dict:
    """Every measured sample, in seconds: compute durations per "<stage><op>"; the time to
    post one send and one receive (from batches of one kind, a batch's span over its ops;
    a mixed batch's receives get what its sends' mean cost leaves); hand-off latencies (from
    the moment a send is out, its share of its batch's span included, to the end of the
    receiver's wait, when the receiver was already waiting, so the latency is all transfer);
    and the runtime's overhead per compute action per rank and step (the gaps between items;
    under torch's runtime, whose posts and waits the spans do not hold, `comms_unseen`'s).
    ``first_s`` holds again, by "<stage><op>", the samples of microbatch 0's action, a step's
    first of its kind on its stage: it costs more than the others (+11-37% for a forward, a
    few percent for a backward, on llama-tiny and the transformer on CPU) and sits on the
    pipeline's fill, where its excess, drawn among the others, left the expected step 2-5%
    short. ``steps`` as in the run report's timeline: [{"step", "ranks": {rank: [Span, ...]}}]."""
    per = defaultdict(list)
    first = defaultdict(list)
    overhead, send_post, recv_post, batches = [], [], [], []
    unseen = comms_unseen(steps, schedule)  # torch's runtime: its posts and waits not in the spans
    for k, s in enumerate(steps):
        for r, spans in s["ranks"].items():
            computes = sum(1 for sp in spans if sp.kind == "compute")
            if computes and spans and unseen is None:  # the rank's own time: no compute, posting, waiting
                covered = sum(sp.end_s - sp.start_s for sp in spans)
                overhead.append((spans[-1].end_s - spans[0].start_s - covered) / computes)
            for key, seconds in action_durations(spans).items():
                per[key] += seconds
            for sp in spans:
                if sp.kind == "compute" and sp.action.mb == 0:
                    first[f"{sp.action.stage}{sp.action.op.value}"].append(sp.end_s - sp.start_s)
                elif sp.kind == "post" and sp.actions:
                    sends = [a.op.is_send for a in sp.actions]
                    batches.append((k, r, sp.actions, sends, sp.start_s, sp.end_s))
                    if all(sends) or not any(sends):
                        (send_post if sends[0] else recv_post).append((sp.end_s - sp.start_s) / len(sp.actions))
    one_send = _mean(send_post)
    for _, _, _, sends, start, end in batches:
        n_send = sum(sends)
        if 0 < n_send < len(sends):
            recv_post.append(max(end - start - n_send * one_send, 0.0) / (len(sends) - n_send))
    one_recv = _mean(recv_post)
    out = {}  # (step, rank, send action) -> when the send was out: its share of the batch's span
    for k, r, actions, sends, start, end in batches:
        weights = [one_send if is_send else one_recv for is_send in sends]
        if not sum(weights):
            weights = [1.0] * len(sends)
        total, done = sum(weights), 0.0
        for a, w, is_send in zip(actions, weights, sends):
            done += w
            if is_send:
                out[(k, r, a)] = start + (end - start) * done / total
    p2p = []
    for k, s in enumerate(steps):
        for h in handoffs(s["ranks"], schedule.stage_to_rank):
            posted = out[(k, h.rank, h.send)]
            if h.wait_start_s <= posted:  # the receiver was already waiting: all of it is transfer
                p2p.append(max(h.wait_end_s - posted, 0.0))
    if unseen is not None:
        overhead, p2p = unseen
    return {
        "action_s": dict(sorted(per.items())),
        "first_s": dict(sorted(first.items())),
        "p2p_s": p2p,
        "overhead_s": overhead,
        "send_post_s": send_post,
        "recv_post_s": recv_post,
    }


def action_durations(spans) -> dict[str, list[float]]:
    """Seconds of each compute action among one rank's ``spans`` (one step's), by "<stage><op>"
    ("<stage>REDUCE_GRAD" for a stage's data-parallel reduction), in the order they ran."""
    out: dict[str, list[float]] = {}
    for sp in spans:
        if sp.kind == "compute":
            a = sp.action
            out.setdefault(f"{a.stage}{a.op.value}", []).append(sp.end_s - sp.start_s)
        elif sp.kind == "reduce":
            out.setdefault(f"{sp.action.stage}{REDUCE}", []).append(sp.end_s - sp.start_s)
    return out


def mean_costs(samples: dict) -> dict:
    """Means of `cost_samples`: seconds per "<stage><op>", hand-off latency, overhead per action,
    time to post one send and one receive."""
    # means, not medians: a step is a sum of many of them, and hand-offs on a busy machine
    # have long tails (p90 at 2-3x the median) that medians would leave out of the prediction
    return {
        "action_s": {k: _mean(v) for k, v in samples["action_s"].items()},
        "p2p_s": _mean(samples["p2p_s"]),
        "overhead_s": _mean(samples["overhead_s"]),
        "send_post_s": _mean(samples["send_post_s"]),
        "recv_post_s": _mean(samples["recv_post_s"]),
    }


def costs_from(measured: dict, num_stages: int) -> schedules.Costs:
    """Simulator costs from measured means: F, I (or B minus W) and W per stage, and B where
    a stage measured both B and I."""
    a = measured["action_s"]

    def get(stage, op, default=0.0):
        return a.get(f"{stage}{op}", default)

    fwd = [get(s, "F") for s in range(num_stages)]
    wgrad = [get(s, "W") for s in range(num_stages)]
    bwd = [get(s, "I") if f"{s}I" in a else get(s, "B") - get(s, "W") for s in range(num_stages)]
    # a stage that ran both B's and I/W's (train.split_backward=drain): its B measured apart
    whole = [get(s, "B") if f"{s}I" in a and f"{s}B" in a else None for s in range(num_stages)]
    return schedules.Costs(
        whole=whole if any(w is not None for w in whole) else None,
        reduce=[get(s, REDUCE) for s in range(num_stages)],
        fwd=fwd,
        bwd=bwd,
        wgrad=wgrad,
        p2p=measured["p2p_s"],
        overhead=measured.get("overhead_s", 0.0),
        send_post=measured.get("send_post_s", 0.0),
        recv_post=measured.get("recv_post_s", 0.0),
    )


def transport_of(cfg, backend: str) -> tuple[str, int]:
    """How the run's hand-offs behave, for the simulator: ppx's runtime on gloo posts each
    send and receive on its own (receives ``runtime.recv_lookahead`` actions early); on NCCL,
    and in torch's runtime (one batch per action, waited on whole), batches are strict."""
    if backend == "gloo" and not schedules.runs_on_torch(cfg.pipeline.schedule, cfg.pipeline.executor):
        return "gloo", cfg.runtime.recv_lookahead
    return "nccl", 0


def predict(
    schedule: Schedule, costs: schedules.Costs, transport: str = "nccl", recv_lookahead: int = 0, reduce: bool = False
) -> dict:
    """Step time and bubble of ``schedule`` at ``costs`` (``reduce``: with data-parallel reductions)."""
    t = schedules.simulate(schedule, costs, transport, recv_lookahead, reduce)
    return {"step_time_s": t.makespan, "bubble_fraction": t.bubble_fraction()}


DRAWS = 32  # simulations whose mean step is an expected step: the run's, and a plan's per candidate


def predict_expected(
    schedule: Schedule,
    samples: dict,
    transport: str = "nccl",
    recv_lookahead: int = 0,
    draws: int = DRAWS,
    seed: int = 0,
    reduce: bool = False,
) -> dict:
    """Mean step time and bubble over ``draws`` simulations with every action's and message's
    cost drawn from the measured ``samples`` (`cost_samples`; microbatch 0's actions from their
    own, ``first_s``): the expected step under the run's variability, where the step of the
    mean costs comes out short. Draw k draws from a
    generator of its own, seeded ``seed`` + k, as a plan draws its candidates
    (`ppx.plan.sampled.expected`): a plan of the run's own config predicts its step."""

    first, later = split_first(samples["action_s"], samples.get("first_s"))  # (microbatch 0's apart)

    def drawn(k: int):
        return schedules.SampledCosts(
            later,
            samples["p2p_s"],
            samples["overhead_s"],
            seed + k,
            samples.get("send_post_s", ()),
            samples.get("recv_post_s", ()),
            first,
        )

    runs = [schedules.simulate(schedule, drawn(k), transport, recv_lookahead, reduce) for k in range(draws)]
    return {
        "step_time_s": statistics.fmean(t.makespan for t in runs),
        "bubble_fraction": statistics.fmean(t.bubble_fraction() for t in runs),
        "draws": draws,
    }


def input_freed_share(saved: float, held: float | None) -> float:
    """The share of a microbatch's saved bytes its I frees: 0 where nothing was measured from
    its I to its W (``held`` None), else 1 - held / saved, below 0 where the stage holds more
    from its I to its W than its forward saved (its graph with the output gradient its W takes
    again; stores larger than the graph; under ``train.recompute`` the graph or the stores of
    the forward the I re-ran)."""
    if held is None or not saved:
        return 0.0
    return min(1.0, 1.0 - held / saved)


def most_per_stage(into: dict, values: dict | None) -> None:
    """``into[stage]`` = the larger of it and ``values[stage]``, for each stage of ``values``
    (the memory counters' bytes per stage, "<stage>" -> bytes)."""
    for stage, b in (values or {}).items():
        into[stage] = max(into.get(stage, 0), b)


def shared_per_stage(into: dict, values: dict | None) -> None:
    """``into[stage]``: the fewest bytes a stage's forward saved that the stage before on its
    rank saves too (`ppx.measure.shared_saves`: a step's microbatch that shared less held more),
    and the earliest of the times the first of the two let them go (a later one would take
    them off the prediction too long)."""
    for stage, v in (values or {}).items():
        was = into.get(stage, v)
        into[stage] = {"bytes": min(was["bytes"], v["bytes"]), "until": min(was["until"], v["until"], key=UNTIL.index)}


def memory_prediction(steps: list[dict], schedule: Schedule, ranks: list[dict]) -> dict:
    """Each rank's peak saved activations predicted from the bytes one microbatch's forward
    saved on each stage (the most over the run's ``steps``, as the memory counters measured
    them) by walking its actions (`ppx.schedules.sim.memory.peak_held`), against ``ranks``' measured
    ``peak_activation_bytes``; {} without the counters or without backwards."""
    saved: dict = {}
    after: dict = {}  # a stage's bytes from I to W (its graph and output gradient, stores, recompute)
    both: dict = {}  # a stage's bytes the stage before on its rank saves too, and when they go
    for s in steps:
        for r in s["ranks"]:
            most_per_stage(saved, r.get("saved_bytes_per_microbatch"))
            most_per_stage(after, r.get("held_after_input_bytes"))
            shared_per_stage(both, r.get("shared_with_stage_before"))
    per = [saved.get(str(st), 0) for st in range(schedule.num_stages)]
    held = [after.get(str(st)) for st in range(schedule.num_stages)]
    if not any(per):
        return {}
    share = [input_freed_share(b, h) for b, h in zip(per, held)]
    both = {k: v for k, v in both.items() if v["bytes"]}
    shared = [(both[k]["bytes"], both[k]["until"]) if k in both else None for k in map(str, range(len(per)))]
    predicted = peak_held(schedule, per, share, shared)
    errors = [
        predicted[r["rank"]] / r["peak_activation_bytes"] - 1
        for r in ranks
        if r.get("peak_activation_bytes") and r["rank"] < len(predicted)
    ]
    return {
        "saved_bytes_per_microbatch": per,
        "input_freed_share": share,
        **({"shared_with_stage_before": both} if both else {}),
        "predicted_peak_activation_bytes": [int(b) for b in predicted],
        "memory_prediction_error": max(errors, key=abs) if errors else None,
    }
