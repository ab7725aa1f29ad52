"""Stalls of the machine in a run's samples: a pause (a collection, the OS, another process)
once in a run is no action's cost, and an expected step drawn from samples that hold it would
charge every simulated step with it (a 65 ms sample among 40 of 1.2 ms put 25% on a predicted
step). The run's own prediction and ``ppx plan --from-run`` leave the same samples out."""

from __future__ import annotations

from statistics import median

STALL = 10.0  # a sample over this many times its action's median, and
STALL_MIN_S = 0.01  # this much above it, is a stall of the machine (where it does not recur every step)


def calm(action_s: dict, steps: int, dropped: dict[str, int]) -> dict:
    """``action_s`` ("<stage><op>" -> samples, seconds) with each list's stalls left out:
    samples over `STALL` times their action's median and `STALL_MIN_S` above it, in fewer than
    half the ``steps`` the samples come from (a cost most steps have, such as a step's first
    forward gathering its weights, stays); the list itself where there are none. What is left
    out is counted into ``dropped`` by key; ``action_s`` itself comes back where nothing was."""
    out = {}
    for key, values in action_s.items():
        if not isinstance(values, list) or len(values) < 3:
            out[key] = values
            continue
        mid = median(values)
        kept = [x for x in values if x <= max(STALL * mid, mid + STALL_MIN_S)]
        if mid <= 0 or not kept or len(kept) == len(values) or 2 * (len(values) - len(kept)) >= steps:
            out[key] = values
            continue
        out[key] = kept
        dropped[key] = dropped.get(key, 0) + len(values) - len(kept)
    return out if any(out[k] is not v for k, v in action_s.items()) else action_s
