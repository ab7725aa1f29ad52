"""Per-rank breakdown of a step: one stacked bar per rank of its compute, communication
(posting plus transfer), data-parallel gradient reduction (when there is one) and idle time, against the step time and the idle the theory
predicts; beside it, each rank's peak saved activation memory. The run report draws its
median step (whose parts add up to its step time) when the run's timers were on."""

from __future__ import annotations

from pathlib import Path

from ppx.files import save_figure
from ppx.report.gantt import COLORS
from ppx.units import byte_unit

PARTS = [
    ("compute_s", "compute", COLORS["F"]),
    ("comm_s", "communication (post + transfer)", COLORS["post"]),
    ("dp_comm_s", "data-parallel gradient reduction", COLORS["reduce"]),
]
IDLE_COLOR = "#F2F2F2"
THEORY_COLOR = "#6A1B9A"  # (red vanished on the orange communication bars; black on the step line)


def parts_of(ranks: list[dict]) -> list[tuple[str, str, str]]:
    """The `PARTS` these rank rows have (the reduction only when parallel.data > 1)."""
    return [p for p in PARTS if p[0] != "dp_comm_s" or any(r.get("dp_comm_s") for r in ranks)]


def has_breakdown(summary: dict) -> bool:
    ranks = summary.get("ranks") or []
    return bool(ranks) and all(r.get("compute_s") is not None for r in ranks)


def title_of(summary: dict, setup: bool = True) -> str:
    """'<experiment>: <schedule>, p=, m=[, v=]' and (``setup``) a compute dtype other than fp32
    and the replicas, whose ranks the pictures leave out."""
    v = summary.get("virtual_stages") or 1
    p = len(summary.get("ranks") or []) or summary.get("world_size")
    title = f"{summary.get('experiment', 'run')}: {summary.get('schedule')}, p={p}, m={summary.get('microbatches')}"
    title += f", v={v}" if v > 1 else ""
    if not setup:
        return title
    if summary.get("dtype") not in (None, "fp32"):
        title += f", {summary['dtype']}"
    data = summary.get("data_parallel") or 1
    return title + (f", {data} replicas (replica 0's ranks)" if data > 1 else "")


def draw_breakdown(summary: dict, path: Path, title: str | None = None) -> None:
    """Write the breakdown picture of ``summary`` (summary.json's dict) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ranks = summary["ranks"]
    step_ms = summary["step_time_s"] * 1e3
    theory = summary.get("bubble_fraction_theory")
    theories = rank_theories(summary)
    peaks = [r.get("peak_activation_bytes") for r in ranks]
    memory = any(b is not None for b in peaks)
    n = len(ranks)
    width = max(6.0, 1.1 * n + 3.5) + (3.0 if memory else 0.0)
    if memory:
        fig, (ax, mem) = plt.subplots(1, 2, figsize=(width, 4.6), gridspec_kw={"width_ratios": [3, 1.3]})
    else:
        fig, ax = plt.subplots(figsize=(width, 4.6))
    xs = list(range(n))
    bottom = [0.0] * n
    parts = parts_of(ranks)
    for key, _, color in parts:
        vals = [(r.get(key) or 0.0) * 1e3 for r in ranks]
        ax.bar(xs, vals, 0.6, bottom=bottom, color=color, edgecolor="white")
        bottom = [b + v for b, v in zip(bottom, vals)]
    idle = [r["idle_s"] * 1e3 for r in ranks]
    ax.bar(xs, idle, 0.6, bottom=bottom, color=IDLE_COLOR, edgecolor="#999999", hatch="//", lw=0.6)
    ax.axhline(step_ms, color="black", lw=1.2)
    top = max([step_ms] + [b + i for b, i in zip(bottom, idle)])
    for x, r, th in zip(xs, ranks, theories):
        share = r["idle_s"] * 1e3 / step_ms if step_ms > 0 else 0.0
        text = f"idle {share:.0%}" + (f"\n(theory {th:.0%})" if th is not None else "")
        ax.text(x, top * 1.02, text, ha="center", va="bottom", fontsize=8)
        if th is not None:  # in theory the top `th` of the step is idle on this rank
            ax.hlines(step_ms * (1 - th), x - 0.38, x + 0.38, colors=THEORY_COLOR, linestyles="--", lw=1.6)
    ax.set_ylim(0, top * 1.22)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"rank {r['rank']}" for r in ranks])
    ax.set_ylabel("ms in the step")
    handles = [Patch(facecolor=c, label=name) for _, name, c in parts]
    handles.append(Patch(facecolor=IDLE_COLOR, edgecolor="#999999", hatch="//", label="idle"))
    handles.append(Line2D([], [], color="black", lw=1.2, label=f"step time {step_ms:.2f} ms"))
    if theory is not None:
        label = theory_label(summary, f"{theory:.0%}")
        handles.append(Line2D([], [], color=THEORY_COLOR, ls="--", lw=1.6, label=label))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, fontsize=8, frameon=False)
    ax.set_title("time in the step by rank", fontsize=10)
    if memory:
        unit, size = byte_unit(max(b or 0 for b in peaks))
        vals = [(b or 0) / size for b in peaks]
        mem.bar(xs, vals, 0.6, color=COLORS["B"])
        for x, b in zip(xs, vals):
            mem.text(x, b, f"{b:.1f}", ha="center", va="bottom", fontsize=8)
        mem.set_ylim(0, max(vals) * 1.2 or 1)  # (a forward-only run saves nothing: 0 to 1, not to 1e-9)
        mem.set_xticks(xs)
        mem.set_xticklabels([f"rank {r['rank']}" for r in ranks])
        mem.set_ylabel(unit)
        mem.set_title("peak saved activations", fontsize=10)
    fig.suptitle(title or title_of(summary), fontsize=11)
    fig.tight_layout()
    save_figure(fig, path, dpi=120, bbox_inches="tight")


def rank_theories(summary: dict) -> list[float | None]:
    """Each rank's theoretical idle share of the step, in ``summary["ranks"]``'s order: its own
    where the run's costs are known (``idle_fraction_theory_by_rank``: unequal stages idle
    apart), else the bubble's, which theory gives every rank (None: no theory)."""
    by_rank = summary.get("idle_fraction_theory_by_rank")
    theory = summary.get("bubble_fraction_theory")
    return [by_rank[r["rank"]] if by_rank else theory for r in summary["ranks"]]


def theory_label(summary: dict, bubble: str) -> str:
    """The legend's words for the theory marks (``bubble``: the bubble, formatted)."""
    if summary.get("idle_fraction_theory_by_rank"):
        return f"theory: idle above this line, each rank's at the model's costs (the step's bubble {bubble})"
    return f"theory: idle above this line ({bubble} of the step)"
