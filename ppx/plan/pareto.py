"""plan.png: predicted step time against peak memory per rank, one colour per schedule, the
Pareto front (no other candidate both faster and smaller) marked, the budget a vertical line
(without bytes given, every peak at 0 and no front)."""

from __future__ import annotations

from pathlib import Path

from ppx.files import save_figure
from ppx.plan.evaluate import Result
from ppx.units import byte_unit, format_bytes


def front(results: list[Result]) -> list[Result]:
    """The candidates no other beats on both step time and peak memory, by memory."""
    by_mem = sorted(results, key=lambda r: (r.peak_max, r.step_s))
    out, best = [], float("inf")
    for r in by_mem:
        if r.step_s < best:
            out.append(r)
            best = r.step_s
    return out


def draw(results: list[Result], path: Path, budget_bytes: float | None, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    names = list(dict.fromkeys(r.schedule for r in results))
    colours = plt.get_cmap("tab20" if len(names) > 10 else "tab10")
    top = max([r.peak_max for r in results] + [budget_bytes or 0])
    unit, scale = byte_unit(top)
    for k, name in enumerate(names):
        mine = [r for r in results if r.schedule == name]
        ax.scatter(
            [r.peak_max / scale for r in mine], [r.step_s * 1e3 for r in mine], color=colours(k), label=name, s=28
        )
    sized = any(r.sized for r in results)  # (no bytes given: every peak 0, and no front to draw)
    edge = front(results) if sized else []
    if edge:
        ax.plot(
            [r.peak_max / scale for r in edge],
            [r.step_s * 1e3 for r in edge],
            "k--",
            lw=1,
            marker="o",
            mfc="none",
            ms=10,
            label="Pareto front",
        )
    if budget_bytes is not None:
        ax.axvline(budget_bytes / scale, color="red", lw=1.5, label=f"budget {format_bytes(budget_bytes)}")
    ax.set_xlabel(
        f"predicted peak memory per rank ({unit}, the busiest rank)"
        if sized
        else "peak memory per rank: not predicted (no bytes given: --act-bytes, --param-bytes or a run's)"
    )
    if not sized:
        ax.set_xticks([])
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
