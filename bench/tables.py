"""`make bench`'s tables: the rows against their targets, the markdown page, and the
generated part of docs/benchmarks.md rewritten in place."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch


def compute_only_idle(run: dict) -> float | None:
    """Idle over all ranks simulated at the run's measured compute costs with the runtime's
    overhead and every hand-off cost set to zero: what is left of the bubble once only the
    actions' own lengths (sleep overshoot included) count."""
    import dataclasses

    from ppx import schedules
    from ppx.measure.prediction import costs_from

    if not run.get("measured_costs") or not run.get("schedule"):
        return None
    p, m, v = len(run["ranks"]), run["microbatches"], run.get("virtual_stages") or 1
    costs = dataclasses.replace(
        costs_from(run["measured_costs"], run["stages"]), overhead=0.0, p2p=0.0, send_post=0.0, recv_post=0.0
    )
    t = schedules.simulate(schedules.build(run["schedule"], p, m, v, "gloo"), costs, "gloo", -1)
    return sum(t.idle(r) for r in range(p))


def beyond_rows(runs: dict) -> list[tuple[str, str, str, str]]:
    idle = {k: sum(r["idle_s"] for r in v["ranks"]) for k, v in runs.items()}
    # the simulator's idle at the run's own measured costs (hand-offs included), for comparison
    sim_idle = {
        k: v["predicted"]["bubble_fraction"] * v["predicted"]["step_time_s"] * len(v["ranks"])
        for k, v in runs.items()
        if v.get("predicted")
    }
    peaks = lambda k: max(r["peak_inflight_microbatches"] for r in runs[k]["ranks"])  # noqa: E731
    out = []
    for t, pre in ((10, "tw_"), (40, "tw40_")):
        if f"{pre}1f1b" not in runs:
            continue
        zb = idle[f"{pre}zb_h1"] / idle[f"{pre}1f1b"]
        bare = [compute_only_idle(runs[pre + k]) for k in ("zb_h1", "1f1b")]
        bare = f"; without overhead and hand-offs {bare[0] / bare[1]:.3f}" if None not in bare else ""
        inter = idle[f"{pre}interleaved"] / idle[f"{pre}1f1b"]
        out += [
            (
                f"ZB-H1 idle time / 1F1B idle time, known-cost p=4 m=8 t_f=t_b=t_w={t} ms (theory 1/3)",
                f"{zb:.3f} (peak in flight {peaks(pre + 'zb_h1')} vs {peaks(pre + '1f1b')}; simulated at the measured "
                f"costs {sim_idle[pre + 'zb_h1'] / sim_idle[pre + '1f1b']:.3f}{bare})",
                "<= 0.33, same peak",
                "pass" if zb <= 1 / 3 + 1e-9 and peaks(pre + "zb_h1") == peaks(pre + "1f1b") else "MISS",
            ),
            (
                f"interleaved 1F1B (v=2) idle time / 1F1B idle time, same cost per rank, t={t} ms (theory 1/2)",
                f"{inter:.2f}",
                "about 0.5",
                "pass" if inter <= 0.6 else "MISS",
            ),
        ]
    if "tw_zb_h1_torch_executor" in runs:
        k = "tw_zb_h1_torch_executor"
        out.append(
            (
                "ppx's ZB-H1 list run by torch's _PipelineScheduleRuntime (pipeline.executor=torch), t=10 ms: "
                "idle / ppx-executed 1F1B idle",
                f"{idle[k] / idle['tw_1f1b']:.2f} (step {runs[k]['step_time_s'] * 1e3:.0f} ms "
                f"vs {runs['tw_zb_h1']['step_time_s'] * 1e3:.0f} ms in ppx's runtime)",
                "(info)",
                "",
            )
        )
    for k, label in [
        ("tw_1f1b", "known-cost 1F1B"),
        ("tw_zb_h1", "known-cost ZB-H1"),
        ("tw_interleaved", "known-cost interleaved v=2"),
        ("tw40_1f1b", "known-cost 1F1B, t=40 ms"),
        ("tw40_zb_h1", "known-cost ZB-H1, t=40 ms"),
        ("tw40_interleaved", "known-cost interleaved v=2, t=40 ms"),
        ("mlp_1f1b_p2_run", "MLP hidden 256 1F1B p=2 (0.3-0.6 ms actions)"),
        ("mlp1024_1f1b_p2_run", "MLP hidden 1024 1F1B p=2 (4-9 ms actions)"),
    ]:
        if k not in runs:
            continue
        err = runs[k]["prediction_error"]["step_time"]
        out.append(
            (
                f"simulator step-time error from measured costs, {label}",
                f"{err:+.1%}",
                "<= 5%",
                "pass" if abs(err) <= 0.05 else "MISS",
            )
        )
    return out


def every_schedule_rows(runs: dict) -> list[tuple[str, str, str, str]]:
    """Each schedule's measured bubble (idle / step time, the run's median) against its theory,
    known-cost model, p=4, m=8, t_f = t_b = t_w = 10 ms per stage."""
    out = []
    for k, run in runs.items():
        if not k.startswith("every_") or run.get("bubble_fraction_theory") is None:
            continue
        got, theory = run["bubble_fraction"], run["bubble_fraction_theory"]
        peak = max(r["peak_inflight_microbatches"] for r in run["ranks"])
        out.append(
            (
                f"measured bubble vs theory, {k[len('every_') :]}, known-cost p=4 m=8 v={run.get('virtual_stages') or 1}, "
                "t_f=t_b=t_w=10 ms per stage",
                f"{got:.1%} vs {theory:.1%} ({got - theory:+.3f}; step {run['step_time_s'] * 1e3:.0f} ms, "
                f"peak in flight {peak})",
                "within 0.03",
                "pass" if abs(got - theory) <= 0.03 else "MISS",
            )
        )
    return out


def rows(results: dict) -> list[tuple[str, str, str, str]]:
    """(what, measured, target, verdict) rows of the table."""
    out = []
    for name in ("mlp_gpipe_p4", "mlp_1f1b_p4", "mlp_1f1b_p2", "mlp_large_1f1b_p2"):
        r = results[name]["median_step_s"]
        ratio = r["ppx"] / r["torch"]
        sched = "GPipe" if "gpipe" in name else "1F1B"
        size = "hidden 1024" if "large" in name else "hidden 256"
        out.append(
            (
                f"ppx / torch.distributed.pipelining step time, MLP {size}, {sched}, p={results[name]['processes']}, m=8",
                f"{ratio:.3f} ({r['ppx'] * 1e3:.2f} ms vs {r['torch'] * 1e3:.2f} ms)",
                "<= 1.00",
                "pass" if ratio <= 1.0 else "MISS",
            )
        )
    for name in ("known_gpipe_p4", "known_1f1b_p4", "known_1f1b_p2"):
        res = results[name]
        ideal = res["ideal_step_s"]
        r = res["median_step_s"]
        sched = "GPipe" if "gpipe" in name else "1F1B"
        ratio = r["ppx"] / ideal
        out.append(
            (
                f"known-cost step / ideal (m+p-1)(t_f+t_b), {sched}, p={res['processes']}, m=8, t_f=10 ms, t_b=20 ms",
                f"ppx {ratio:.3f}, torch {r['torch'] / ideal:.3f} (ideal {ideal * 1e3:.0f} ms)",
                "<= 1.03",
                "pass" if ratio <= 1.03 else "MISS",
            )
        )
    sizes = {
        "overhead_known_1f1b_p4": "known-cost model, p=4",
        "overhead_mlp_1f1b_p2": "MLP hidden 256, p=2",
        "overhead_mlp_large_1f1b_p2": "MLP hidden 1024, p=2",
        "overhead_llama_tiny_1f1b_p2": "llama-tiny (8 blocks), p=2, m=8",
    }
    for name, size in sizes.items():
        if name not in results:  # a case added after the results were measured
            continue
        r = results[name]["median_step_s"]
        t = r["ppx_timers"] / r["ppx"] - 1
        a = r["ppx_all"] / r["ppx"] - 1
        if "known" in name:
            target, verdict = "<= 2%", "pass" if t <= 0.02 else "MISS"
        else:  # millisecond CPU steps on 2 shared cores: run-to-run noise here is about +-4%
            target, verdict = "(info: noise +-4%)", ""
        out.append((f"timer overhead (timers on / off - 1), {size}, 1F1B, profiler off", f"{t:+.1%}", target, verdict))
        if "ppx_all_steps" not in r:  # measured before the counters counted only the first steps
            out.append((f"timers + memory counters overhead, {size}, 1F1B, profiler off", f"{a:+.1%}", "(info)", ""))
            continue
        e = r["ppx_all_steps"] / r["ppx"] - 1
        out.append(
            (
                f"timers + memory counters overhead as `ppx run` has them (saved bytes counted in the first step), {size}, 1F1B",
                f"{a:+.1%}",
                "<= 2%" if "known" in name else "(info: noise +-4%)",
                ("pass" if a <= 0.02 else "MISS") if "known" in name else "",
            )
        )
        out.append(
            (
                f"timers + memory counters counting every step (instrument.memory_steps=0), {size}, 1F1B",
                f"{e:+.1%}",
                "(info)",
                "",
            )
        )
    micro = results["micro"]
    out.append(
        (
            "timer cost per program item (in-process microbenchmark)",
            f"{micro['timer_s_per_item'] * 1e6:.2f} us",
            "(info)",
            "",
        )
    )
    step, items = micro["mlp_p2_step_s"], micro["mlp_p2_items_per_rank"]
    share = micro["timer_s_per_item"] * items / step
    out.append(
        (
            f"timer cost as a share of the MLP hidden 256 1F1B p=2 step ({items} items per rank, {step * 1e3:.1f} ms)",
            f"{share:.2%}",
            "<= 2%",
            "pass" if share <= 0.02 else "MISS",
        )
    )
    out.append(
        (
            "memory counters cost per microbatch (forward + backward, MLP hidden 256 stage)",
            f"{micro['memory_s_per_microbatch'] * 1e6:.1f} us",
            "(info)",
            "",
        )
    )
    if "runs" in results:
        out += beyond_rows(results["runs"])
        out += every_schedule_rows(results["runs"])
        out += data_parallel_rows(results["runs"])
        out += model_cost_rows(results["runs"])
    if "plans" in results:
        from bench.plan_check import plan_rows

        out += plan_rows(results["plans"])
    if "split_backward" in results:
        from bench.split_backward import split_rows

        out += split_rows(results["split_backward"])
    if "split_large" in results:
        from bench.split_backward import large_rows

        out += large_rows(results["split_large"])
    if "split_paired" in results:
        from bench.split_paired import paired_rows

        out += paired_rows(results["split_paired"], results.get("machine") or this_machine())
    if "split_costs" in results:
        from bench.split_costs import rows as split_cost_rows

        out += split_cost_rows(results["split_costs"])
    if "printed_plans" in results:
        from bench.plan_printed import rows as printed_rows

        out += printed_rows(results["printed_plans"])
    return out


def data_parallel_rows(runs: dict) -> list[tuple[str, str, str, str]]:
    """pp=2 x dp=2 against pp=2 alone at the same per-replica batch, known-cost model."""
    base, dp = runs.get("dp_base_1f1b_p2"), runs.get("dp_1f1b_p2x2")
    if not base or not dp:
        return []
    ratio = dp["step_time_s"] / base["step_time_s"]
    reduce_ms = ", ".join(f"rank {r['rank']} {r['dp_comm_s'] * 1e3:.2f}" for r in dp["ranks"])
    return [
        (
            "pp=2 x dp=2 step / pp=2 step, same per-replica batch, known-cost 1F1B m=8, t_f=10 ms, t_b=20 ms",
            f"{ratio:.3f} ({dp['step_time_s'] * 1e3:.1f} ms vs {base['step_time_s'] * 1e3:.1f} ms; reduction ms: "
            f"{reduce_ms})",
            "<= 1.10",
            "pass" if ratio <= 1.10 else "MISS",
        )
    ]


def model_cost_rows(runs: dict) -> list[tuple[str, str, str, str]]:
    """Each model's measured per-stage F, I (B's input part) and W and saved bytes per
    microbatch (a rank's peak saved activations over its peak microbatches in flight), zb_h1 p=2."""
    names = {
        "cost_mlp256_zb_h1_p2": "MLP hidden 256, 8 blocks",
        "cost_llama_tiny_zb_h1_p2": "llama-tiny",
        "cost_llama1b_2blocks_zb_h1_p2": "llama-1b shapes, 2 of 16 blocks, 64 tokens",
    }
    out = []
    for key, what in names.items():
        run = runs.get(key)
        if not run or not run.get("measured_costs"):
            continue
        a = run["measured_costs"]["action_s"]
        stages = []
        for r in run["ranks"]:
            s = r["rank"]
            per_mb = r["peak_activation_bytes"] / max(r["peak_inflight_microbatches"], 1)
            stages.append(
                f"stage {s}: F {a[f'{s}F'] * 1e3:.2f}, I {a[f'{s}I'] * 1e3:.2f}, W {a[f'{s}W'] * 1e3:.2f} ms, "
                f"{per_mb / 2**20:.2f} MiB saved/mb"
            )
        mb = run.get("microbatches")
        out.append((f"per-stage costs, {what}, zb_h1 p=2 m={mb}", "; ".join(stages), "(info)", ""))
    return out


def this_machine() -> str:
    """The machine the header names: processor, cores, Python and torch. `make bench` keeps it
    in results.json (``machine``), so rows measured again elsewhere can say where."""
    return (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}"
    )


def markdown(results: dict, scale: float) -> str:
    measured = results.get("measured_on") or time.strftime("%Y-%m-%d")
    again, cases = results.get("rerun"), results.get("cases_rerun")
    head = [
        "# Benchmarks",
        "",
        f"Measured by `make bench` on {measured}"
        + (f" (runs {', '.join(again['runs'])} on {again['date']}, by `bench/run.py --runs`)" if again else "")
        + (f" (cases {', '.join(cases['cases'])} on {cases['date']}, by `bench/run.py --cases`)" if cases else "")
        + f": {results.get('machine') or this_machine()}, CPU + gloo, 1 thread per process, "
        "each process pinned as `ppx run` pins CPU ranks (`runtime.pin_cpus`: its own block of CPUs; with more "
        "ranks than CPUs, one CPU each, round robin).",
        "Each case runs its variants side by side in one torchrun job, alternating step by step (20 to 300 measured "
        f"steps per variant{'' if scale == 1 else f', scaled by {scale}'}, after 3 warm-up steps); every step starts on "
        "all ranks at the same instant (its data made before, as a prefetching loader has it) and lasts until the "
        "last rank finishes; the table shows medians. Reproduce "
        "with `make bench` (these cases about 7 minutes, with the whole runs, plans and split-backward rows below "
        "about an hour; `BENCH_SCALE=2 make bench` measures twice as many steps).",
        "",
        "| benchmark | measured | target | |",
        "| --- | --- | --- | --- |",
    ]
    body = [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows(results)]
    notes = [
        "",
        "torch.distributed.pipelining runs the same stage modules (the same weights) on the same data; on the",
        "known-cost model both runtimes get the same cost semantics (a stage's action lasts exactly t_f or t_b",
        "from the moment the runtime starts it). Raw medians are in `bench/results.json`.",
        "",
        "What the known-cost rows rest on (a 2-vCPU microVM on a shared host; measured on 2026-11-21): the",
        "actions are exact (the runtime waits out each action's charge, spinning its last 0.25 ms: 10.0-10.1 ms",
        "per 10 ms forward), so everything above the ideal is hand-offs. `schedules.simulate` puts 1F1B at p=4,",
        "m=8, 10/20 ms at ideal + 19 hand-offs on the critical path, so 1.03 x ideal allows 0.52 ms per hand-off,",
        "everything included. Hand-offs are slow here because every wake-up that crosses vCPUs is: a raw socket",
        "message between two processes arrives in 8 us on one CPU and 120 us across two; a gloo send posted",
        "after 10 ms of compute takes 0.17-0.2 ms to post (37 us hot) and reaches a waiting receiver 0.07-0.09 ms",
        "after that. ppx",
        "(1) posts all of a step's receives at the rank's first wait, where it idles anyway",
        "(`runtime.recv_lookahead=-1`): gloo's transport sends only once the receive is posted, so the data lands",
        "while the receiver computes, and no receive is posted between two computes (side by side, known-cost",
        "1F1B p=4 went from 1.041-1.045 to 1.032-1.034, MLP hidden 256 1F1B p=4 from 29-32 to 25-28.5 ms);",
        "(2) pins each rank to its own CPUs (`runtime.pin_cpus`), so the gloo thread a message wakes does not",
        "preempt a neighbour's compute while the other CPU idles (MLP 1F1B p=2: 18 to 13-14 ms); with 4 ranks on",
        "2 CPUs they share round robin (ranks 0,2 | 1,3), so a hand-off never queues the receiver behind its",
        "sender, busy posting at that moment (side by side on 2026-11-22: known-cost p=4 GPipe and 1F1B from",
        "1.024-1.028 to 1.022, MLP hidden 256 GPipe p=4 from 19-21 to 15 ms, torch gaining alike).",
        "torch.distributed.pipelining runs in the same pinned processes, side by side, in the same rows. With",
        "this machine's noise (torch's known-cost ratio ranged 1.04-1.10 over these sessions' runs), the p=4",
        "rows land at 1.020-1.025 from run to run.",
        "",
        "Idle and bubble exclude transfer: the part of a wait after the peer posted the matching send counts as",
        "communication (`transfer_s`), as hand-off latency is not the schedule's bubble. What stays in idle is",
        "waiting for a peer that has not sent yet, which still includes latency handed down the pipeline (a",
        "late hand-off upstream makes the next rank's peer send late), so ZB-H1/1F1B stays a little above 1/3.",
        "No schedule can do better at 1F1B's memory: holding at most p microbatches (until their W), rank 0 idles",
        "after its p-th forward until its first I returns, (p-1)t + 2(p-1)c with c per hand-off, and again",
        "2(p-1)c waiting for the last I after its last forward, as it then holds only p-1 other microbatches' I",
        "and W to fill (2(p-1)t) against a round trip of 2(p-1)t + 2(p-1)c. Idle >= (p-1)(t + 4c) against 1F1B's",
        "3(p-1)t + its own hand-off idle, which measures 4-6 ms here (about 15 hand-offs), while 1/3 would need",
        "12(p-1) = 36 of them: the 1/3 is reached only as c/t -> 0 (the simulator puts it at 0.334 at t=100 ms).",
        "The rows say where the rest goes: simulated at the run's measured costs the ratio lands near the measured one;",
        "with the runtime's overhead between actions and every hand-off cost set to zero, only the actions' own",
        "lengths (sleeps that overshoot by 0.01-0.1 ms, ZB-H1 having 3 actions per microbatch to 1F1B's 2) keep it",
        "above 1/3 (each row's last figure).",
        "",
        "The simulator rows predict with the run's own transport (gloo: every send and receive on its own,",
        "receives posted at the first wait, each send and receive taking its measured posting time) the",
        "expected step: the mean of 32 simulations (64 before 2026-11-30) with every action's, post's and",
        "message's cost drawn from the samples measured over the run's timeline steps (each stage's microbatch 0",
        "from its own since 2026-11-30: a step's first action of its kind costs more, docs/metrics.md), held",
        "against the mean step time of the same steps.",
        "The step of the mean costs comes out short on this machine: its one-off stalls of 1-4 ms (a post that",
        "takes 4 ms, once in a few steps) cost all of their delay on the critical path, but a mean spreads them;",
        "on the MLP (hidden 256 and 1024) that was 7-17% measured over predicted in one session, against -6..+2%",
        "for the expected step on the same runs (the rows above are the expected step).",
    ]
    return "\n".join(head + body + notes) + "\n"


BEGIN = "<!-- bench:begin (generated by `make bench`, bench/run.py: everything down to bench:end) -->"
END = "<!-- bench:end -->"


def write_generated(path: Path, md: str) -> None:
    """Replace the generated part of ``path`` (BEGIN down to END) with ``md``, keeping the
    hand-written sections after it."""
    rest = ""
    if path.exists():
        text = path.read_text()
        if END in text:
            rest = text[text.index(END) + len(END) :]
    path.write_text(f"{BEGIN}\n{md.rstrip()}\n{END}{rest}")
