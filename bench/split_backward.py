"""`make bench`'s split-backward rows: does a zero-bubble schedule pay for splitting its
backward on a real model? (`train.split_backward`, ppx/engine/weight_store.py)

For llama-tiny's shapes (8 blocks, so ZB-V fits at p=4) and the transformer experiment's, in
fp32 and bf16, at p=2 and p=4 (m=8), whole `ppx run`s, each variant `REPEATS[p]` times round robin
(a slow spell of the machine falls on all alike), a variant held by the median of its runs'
median steps:

- 1F1B: B per stage, and the step every zero-bubble variant is held against;
- ZB-H1 and ZB-V with stores (auto: llama and the transformer store on every stage);
- ZB-H1 the graph's way (``train.split_backward=graph``: I keeps the graph, W walks it again,
  what ppx did before stores): the "before" of I + W and of the peak saved bytes;
- fp32 only: the same ZB-H1 and ZB-V lists run by torch.distributed.pipelining's runtime
  (``pipeline.executor=torch``: its stage_backward_input / stage_backward_weight), which
  refuses bf16 autocast here.

bench/split_paired.py (`bench/run.py --split-paired`) settles the step comparison where whole
runs cannot, step by step beside 1F1B.

Rows: (I + W) / B per stage from the runs' measured action costs (target <= 1.10), the ZB-H1
and ZB-V steps against 1F1B's (target: ZB-H1 faster), and each rank's peak saved bytes with
stores against the graph's way. Next to the measured steps, two figures that read them:

- the *ceiling*: ZB-H1's (ZB-V's) step over 1F1B's with the zero-bubble runs' own F, I and W,
  both lists simulated with no runtime overhead and instant hand-offs, 1F1B's B costing I + W.
  It is what the schedule can gain on this model whatever the runtime (on these tiny models W
  is a quarter of B, not the third or half the schedules' theory assumes, so there is little
  to fill the bubble with);
- each variant's step as the simulator predicts it from its own runs' measured costs (the
  runs' summary.json ``predicted``): where measured and predicted agree, the verdict is the
  costs', not the runtime's.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ppx.config import SUMMARY_ONLY, as_overrides
from ppx.gpucheck.split import iw_over_b

ROOT = Path(__file__).resolve().parent.parent
REPEATS = {2: 4, 4: 2}  # per p: at p=2 the steps of ZB-H1 and 1F1B lie within a few % of each other
MODELS = {
    "llama-tiny (8 blocks)": ["llama_tiny_1f1b_2cpu", "model.layers=8"],
    "transformer (hidden 64, 8 blocks)": ["transformer_1f1b_2cpu", "model.layers=8"],
}
M = 8
SHAPE = [f"pipeline.microbatches={M}", "train.batch_size=32"]
COMMON = [
    *SHAPE,
    "train.steps=12",
    "instrument.timeline_steps=8",
    "logging.tensorboard=false",
]
VARIANTS = {  # name -> (overrides, fp32 only)
    "1f1b": (["pipeline.schedule=1f1b"], False),
    "zb_h1": (["pipeline.schedule=zb_h1"], False),
    "zbv": (["pipeline.schedule=zbv"], False),
    "zb_h1_graph": (["pipeline.schedule=zb_h1", "train.split_backward=graph"], False),
    "zb_h1_torch": (["pipeline.schedule=zb_h1", "pipeline.executor=torch"], True),
    "zbv_torch": (["pipeline.schedule=zbv", "pipeline.executor=torch"], True),
}
CONFIGS = {  # "<model> <dtype> p=<p>" -> (model, dtype, p)
    f"{model} {dtype} p={p}": (model, dtype, p) for model in MODELS for dtype in ("fp32", "bf16") for p in (2, 4)
}
# where the matmuls dominate the dispatch: llama-1b's shapes (hidden 2048, ffn 8192, vocab
# 128256), 6 of its 16 blocks and 64 tokens, balanced over p=2 (the embedding and 5 blocks;
# 1 block and the vocabulary head, which costs about 4 blocks), fp32, m=4
LARGE_NAME = "llama-1b shapes (6 blocks, 64 tokens) fp32 p=2"
LARGE = [
    "gpipe_4gpu",
    "runtime.device=cpu",
    "model.kind=llama",
    "model.preset=llama-1b",
    "model.layers=6",
    "model.seq_len=64",
]
LARGE_P, LARGE_M = 2, 4
LARGE_COMMON = [
    f"pipeline.stages={LARGE_P}",
    "pipeline.layers_per_stage=[6,2]",
    f"pipeline.microbatches={LARGE_M}",
    "train.batch_size=4",
    "train.steps=5",
    "instrument.timeline_steps=4",
    "logging.tensorboard=false",
]
LARGE_REPEATS = 3


def _run(overrides: list[str], run_dir: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "ppx.cli", "run", *overrides, *as_overrides(SUMMARY_ONLY), f"run.dir={run_dir}"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench split: {' '.join(overrides)} failed:\n{proc.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def check_config(model: str, dtype: str, p: int) -> dict:
    """Every variant of one (model, dtype, p), `REPEATS[p]` runs each round robin."""
    exp, *model_keys = MODELS[model]
    base = [exp, *model_keys, *COMMON, f"train.dtype={dtype}", f"pipeline.stages={p}"]
    names = [n for n, (_, fp32_only) in VARIANTS.items() if dtype == "fp32" or not fp32_only]
    out = _measure(base, names, REPEATS[p], p)
    v = out["variants"]
    out["iw_over_b_graph"] = iw_over_b(v["zb_h1_graph"]["action_s"], v["1f1b"]["action_s"], p)
    print(
        f"  split {model} {dtype} p={p}: (I+W)/B {_fmt(out['iw_over_b'])} (graph's way {_fmt(out['iw_over_b_graph'])});"
        f" step ms 1f1b {v['1f1b']['step_s'] * 1e3:.1f}, zb_h1 {v['zb_h1']['step_s'] * 1e3:.1f},"
        f" zbv {v['zbv']['step_s'] * 1e3:.1f}",
        flush=True,
    )
    return out


def check_large() -> dict:
    """1F1B against ZB-H1 where the matmuls dominate (`LARGE`), `LARGE_REPEATS` runs each
    round robin."""
    exp, *keys = LARGE
    out = _measure([exp, *keys, *LARGE_COMMON], ["1f1b", "zb_h1"], LARGE_REPEATS, LARGE_P)
    v = out["variants"]
    print(
        f"  split {LARGE_NAME}: (I+W)/B {_fmt(out['iw_over_b'])}; step ms 1f1b {_fmt_ms(v['1f1b']['runs_s'])},"
        f" zb_h1 {_fmt_ms(v['zb_h1']['runs_s'])}",
        flush=True,
    )
    return out


def _measure(base: list[str], names: list[str], repeats: int, p: int) -> dict:
    """``names``' variants on ``base``, ``repeats`` runs each round robin: per variant the
    median step, each action's median cost, the peak saved bytes per rank; (I + W) / B of
    ZB-H1 against 1F1B per stage."""
    runs: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as t:
        for rep in range(repeats):
            for n in names:
                runs[n].append(_run(base + VARIANTS[n][0], Path(t) / f"{n}_{rep}"))
    out = {"variants": {}}
    for n, got in runs.items():
        steps = sorted(s["step_time_s"] for s in got)
        costs = {}
        for a in got[0]["measured_costs"]["action_s"]:  # each action's median over the runs' means
            costs[a] = statistics.median(s["measured_costs"]["action_s"][a] for s in got)
        out["variants"][n] = {
            "step_s": statistics.median(steps),
            "runs_s": steps,
            "action_s": costs,
            "peak_saved_bytes": [max(s["ranks"][r]["peak_activation_bytes"] for s in got) for r in range(p)],
            "split_backward": got[0].get("split_backward"),
            "bubble": statistics.median(s.get("bubble_fraction") or 0.0 for s in got),
            "predicted_s": statistics.median(s["predicted"]["step_time_s"] for s in got if s.get("predicted")),
        }
    v = out["variants"]
    out["iw_over_b"] = iw_over_b(v["zb_h1"]["action_s"], v["1f1b"]["action_s"], p)
    out["cores"] = len(os.sched_getaffinity(0))  # fewer than p: the ranks' times are shared, not judged
    return out


def ceiling(variants: dict, name: str, p: int, m: int) -> float:
    """``name``'s step over 1F1B's, both simulated from ``name``'s measured per-stage F, I and
    W with no runtime overhead and instant hand-offs (1F1B's rank: the same stages' work, B
    costing I + W): the most the schedule can gain with these costs."""
    from ppx import schedules
    from ppx.measure.prediction import costs_from

    zb = schedules.build(name, p, m)
    split = costs_from({"action_s": variants[name]["action_s"], "p2p_s": 0.0}, zb.num_stages)

    def per_rank(costs: list[float]) -> list[float]:
        return [sum(costs[s] for s in zb.stages_of(r)) for r in range(p)]

    one = schedules.Costs(fwd=per_rank(split.fwd), bwd=per_rank(split.bwd), wgrad=per_rank(split.wgrad))
    return schedules.simulate(zb, split).makespan / schedules.simulate(schedules.build("1f1b", p, m), one).makespan


def _predicted(v: dict, names: tuple[str, ...]) -> str:
    """The variants' steps as predicted from their runs' own costs (results of older benches
    have none)."""
    if not all(v[n].get("predicted_s") for n in names):
        return ""
    return "; predicted from the runs' costs " + ", ".join(f"{n} {v[n]['predicted_s'] * 1e3:.1f}" for n in names)


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in values)


def _fmt_ms(seconds: list[float]) -> str:
    return "/".join(f"{x * 1e3:.0f}" for x in seconds)


def matching(names, only: str | None, flag: str) -> list[str]:
    """The configuration ``names`` that hold ``only`` (all of them for None); none is refused
    in one line, before anything runs."""
    if only is None:
        return list(names)
    got = [n for n in names if only in n]
    if not got:
        raise SystemExit(f"bench/run.py {flag} {only!r}: no configuration's name holds it: {', '.join(names)}")
    return got


def check_all(only: str | None = None) -> dict:
    """Every configuration's variants, or those whose name ("<model> <dtype> p=<p>") holds ``only``."""
    return {n: check_config(*CONFIGS[n]) for n in matching(CONFIGS, only, "--split")}


def split_rows(results: dict) -> list[tuple[str, str, str, str]]:
    """Three rows per (model, dtype, p): (I + W)/B, the steps, the peak saved bytes."""
    out = []
    for name, got in results.items():
        v = got["variants"]
        iw, before = got["iw_over_b"], got["iw_over_b_graph"]
        p = int(name.rsplit("p=", 1)[1])
        shared = _shared(p, got.get("cores"))
        ways = v["zb_h1"].get("split_backward") or {}
        # a stage run whole (every I followed at once by its W) splits nothing: its I + W is its B
        shown = ", ".join(
            f"{x:.2f}" + (" (whole)" if (ways.get(str(s)) or {}).get("mode") == "whole" else "")
            for s, x in enumerate(iw)
        )
        out.append(
            (
                f"split backward, {name}, m=8: (I + W) / B per stage, zb_h1 (train.split_backward=auto) against 1F1B's B",
                f"{shown} (the graph's way: {_fmt(before)})" + shared,
                "<= 1.10",
                "not judged" if shared else "pass" if max(iw) <= 1.10 else "MISS",
            )
        )
        ms = {n: x["step_s"] * 1e3 for n, x in v.items()}
        spread = {n: f"runs {_fmt_ms(v[n]['runs_s'])}" for n in ("1f1b", "zb_h1")}
        parts = [
            f"1F1B {ms['1f1b']:.1f} ({spread['1f1b']})",
            f"ZB-H1 {ms['zb_h1']:.1f} ({ms['zb_h1'] / ms['1f1b']:.2f}x; {spread['zb_h1']})",
        ]
        parts.append(f"ZB-V {ms['zbv']:.1f} ({ms['zbv'] / ms['1f1b']:.2f}x)")
        parts.append(f"ZB-H1 the graph's way {ms['zb_h1_graph']:.1f}")
        if "zb_h1_torch" in ms:
            parts.append(f"torch's runtime: ZB-H1 {ms['zb_h1_torch']:.1f}, ZB-V {ms['zbv_torch']:.1f}")
        parts.append(
            f"ceiling with these costs: ZB-H1 {ceiling(v, 'zb_h1', p, M):.2f}x, ZB-V {ceiling(v, 'zbv', p, M):.2f}x"
            + _predicted(v, ("1f1b", "zb_h1", "zbv"))
        )
        out.append(
            (
                f"split backward, {name}, m=8: step ms ({len(v['1f1b']['runs_s'])} runs each, round robin)",
                "; ".join(parts) + shared,
                "ZB-H1 < 1F1B",
                "not judged" if shared else "pass" if ms["zb_h1"] < ms["1f1b"] else "MISS",
            )
        )
        kib = lambda bs: ", ".join(f"{b / 1024:.0f}" for b in bs)  # noqa: E731
        out.append(
            (
                f"split backward, {name}: ZB-H1 peak saved KiB per rank, stores against the graph's way",
                f"{kib(v['zb_h1']['peak_saved_bytes'])} against {kib(v['zb_h1_graph']['peak_saved_bytes'])}",
                "(info)",
                "",
            )
        )
    return out


def _shared(p: int, cores: int | None) -> str:
    """What a row of ``p`` ranks measured on ``cores`` cores says where they shared cores: no
    verdict on its times (a rank's action then takes its share of a core, and no schedule gains
    from its bubble there; docs/benchmarks.md, "At p=4"); its saved bytes stand."""
    if cores is None or p <= cores:
        return ""
    return f" ({p} ranks on {cores} cores: times shared, not judged)"


def large_rows(got: dict) -> list[tuple[str, str, str, str]]:
    """`check_large`'s two rows: (I + W) / B per stage, and the steps."""
    v = got["variants"]
    one, zb = v["1f1b"], v["zb_h1"]
    bubble = ", ".join(f"{n} {x['bubble']:.1%}" for n, x in (("1F1B", one), ("ZB-H1", zb)) if "bubble" in x)
    return [
        (
            f"split backward where matmuls dominate, {LARGE_NAME}, m=4: (I + W) / B per stage, zb_h1 against 1F1B's B",
            _fmt(got["iw_over_b"]),
            "<= 1.10",
            "pass" if max(got["iw_over_b"]) <= 1.10 else "MISS",
        ),
        (
            f"split backward where matmuls dominate, {LARGE_NAME}, m=4: step ms ({LARGE_REPEATS} runs each, round robin)",
            f"1F1B {one['step_s'] * 1e3:.0f} (runs {_fmt_ms(one['runs_s'])}); ZB-H1 {zb['step_s'] * 1e3:.0f} "
            f"({zb['step_s'] / one['step_s']:.2f}x; runs {_fmt_ms(zb['runs_s'])}); median bubble {bubble}; "
            f"ceiling with these costs {ceiling(v, 'zb_h1', LARGE_P, LARGE_M):.2f}x" + _predicted(v, ("1f1b", "zb_h1")),
            "ZB-H1 < 1F1B",
            "pass" if zb["step_s"] < one["step_s"] else "MISS",
        ),
    ]


if __name__ == "__main__":  # `python bench/split_backward.py`: these rows alone, printed
    sys.path.insert(0, str(ROOT))
    for row in split_rows(check_all()):
        print(" | ".join(row))
