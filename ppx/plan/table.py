"""The ranked table of a plan, as aligned text (printed) and as markdown (plan.md)."""

from __future__ import annotations

from ppx.plan.evaluate import Result
from ppx.units import format_bytes


def header(microbatch_size: int | None) -> list[str]:
    rate = "samples/s" if microbatch_size else "microbatches/s"
    return ["rank", "schedule", "p", "m", "v", "step (ms)", "steady (ms)", rate, "bubble (%)", "peak/rank", "fits"]


def rows(results: list[Result], microbatch_size: int | None) -> list[list[str]]:
    """One row per result, in order."""
    out = []
    for k, r in enumerate(results, 1):
        rate = r.throughput * (microbatch_size or 1)
        out.append(
            [
                str(k),
                r.schedule,
                str(r.p),
                str(r.m),
                str(r.v),
                f"{r.step_s * 1e3:.2f}",
                f"{r.steady_s * 1e3:.2f}",
                f"{rate:.1f}",
                f"{r.bubble * 100:.1f}",
                format_bytes(r.peak_max) if r.sized else "-",  # (no bytes given: no peak to tell)
                ("yes" if r.fits else "no") if r.budgeted else "-",  # (no budget: nothing to fit)
            ]
        )
    return out


def text(results: list[Result], microbatch_size: int | None) -> str:
    """Aligned columns: names left, numbers right."""
    grid = [header(microbatch_size)] + rows(results, microbatch_size)
    widths = [max(len(row[k]) for row in grid) for k in range(len(grid[0]))]
    left = {1, 10}
    return "\n".join(
        "  ".join(c.ljust(w) if k in left else c.rjust(w) for k, (c, w) in enumerate(zip(row, widths))).rstrip()
        for row in grid
    )


def markdown(results: list[Result], microbatch_size: int | None) -> str:
    grid = [header(microbatch_size)] + rows(results, microbatch_size)
    lines = ["| " + " | ".join(grid[0]) + " |", "|" + "---|" * len(grid[0])]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in grid[1:]])
