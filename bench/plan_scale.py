"""How long planning takes at scale: every candidate schedule built (`registry.build`: the
pure schedule, its comms placed and checked), simulated and its memory predicted, as `ppx
plan` evaluates them. Candidates: every family but forward_only, the virtual ones at v = 2,
3, 4 where their shape rule allows, the others at their default v.

    python bench/plan_scale.py --stages 64 --microbatches 512

prints seconds per candidate (build, simulate, peak_held) and the total: wall seconds and the
CPU seconds of the work (which other load on the machine inflates less); ``--jobs 2`` spreads
the candidates over two processes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ppx.schedules import Costs, registry, simulate  # noqa: E402
from ppx.schedules.sim import memory

COSTS = Costs(fwd=1, bwd=1, wgrad=0.5, p2p=0.1)


def candidates(p: int, m: int, virtual=(2, 3, 4)) -> list[tuple[str, int]]:
    """(family, v) of every candidate at ``p`` stages and ``m`` microbatches."""
    out = []
    for name, fam in registry.FAMILIES.items():
        if name == "forward_only":
            continue
        for v in virtual if fam.virtual else (fam.default_virtual,):
            if fam.shape_error(p, m, v) is None:
                out.append((name, v))
    return out


def evaluate(candidate: tuple[str, int, int, int]) -> tuple:
    """One candidate's (name, v, actions, build s, simulate s, memory s, step, CPU s)."""
    name, v, p, m = candidate
    cpu = time.process_time()
    t0 = time.perf_counter()
    s = registry.build(name, p, m, v)
    t1 = time.perf_counter()
    t = simulate(s, COSTS)
    t2 = time.perf_counter()
    memory.peak_held(s, [1.0] * s.num_stages)
    t3 = time.perf_counter()
    n = sum(len(row) for row in s.actions)
    return name, v, n, t1 - t0, t2 - t1, t3 - t2, t.makespan, time.process_time() - cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", "-p", type=int, default=64)
    ap.add_argument("--microbatches", "-m", type=int, default=512)
    ap.add_argument("--only", nargs="*", default=None, help="family names to keep")
    ap.add_argument("--jobs", "-j", type=int, default=1, help="processes over candidates (1: this one)")
    args = ap.parse_args(argv)
    p, m = args.stages, args.microbatches
    todo = [(name, v, p, m) for name, v in candidates(p, m) if not args.only or name in args.only]
    total = {"build": 0.0, "simulate": 0.0, "memory": 0.0, "cpu": 0.0}
    print(f"p={p} m={m}  {'candidate':<22} {'actions':>8} {'build s':>8} {'sim s':>8} {'mem s':>8} {'step':>10}")
    start = time.perf_counter()
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.imap(evaluate, todo)
            total["cpu"] += _report(results, total)
    else:
        total["cpu"] += _report(map(evaluate, todo), total)
    wall = time.perf_counter() - start
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in total.items() if k != "cpu")
    print(f"total {wall:.1f} s wall, {total['cpu']:.1f} s CPU in {args.jobs} process(es) ({parts})")
    return 0


def _report(results, total: dict) -> float:
    """Print each candidate's line as it comes, add its seconds up; returns the CPU seconds."""
    cpu = 0.0
    for name, v, n, build, sim, mem, step, used in results:
        for k, dt in zip(("build", "simulate", "memory"), (build, sim, mem)):
            total[k] += dt
        cpu += used
        print(f"{'':<12}{f'{name} v={v}':<22} {n:>8} {build:>8.2f} {sim:>8.2f} {mem:>8.2f} {step:>10.1f}")
    return cpu


if __name__ == "__main__":
    raise SystemExit(main())
