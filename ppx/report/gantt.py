"""Gantt picture of one measured step: F, B (or I and W), communication and waiting per rank
over time; white is idle (in a simulated step, which has no communication spans: communication
and idle, as its legend says). The part of a wait after the peer posted the matching send is drawn
as transfer. With several stages per rank, cells name their stage and a rank's later stages
are drawn lighter. The measured counterpart of `ppx schedule`'s grid."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ppx.files import save_figure

COLORS = {
    "F": "#4C72B0",
    "B": "#55A868",
    "I": "#8172B2",
    "W": "#937860",
    "post": "#DD8452",
    "wait": "#D9D9D9",
    "transfer": "#F3DC6B",
    "reduce": "#DA8BC3",
}
OP_NAMES = [("F", "forward"), ("B", "backward"), ("I", "input-grad backward (I)"), ("W", "weight-grad backward (W)")]
COMM_NAMES = [
    ("post", "send/recv posted"),
    ("wait", "waiting on a peer"),
    ("transfer", "transfer (peer had sent)"),
    ("reduce", "data-parallel gradient reduction"),
]


def stage_shades(stage_to_rank) -> dict[int, float]:
    """Each stage's opacity: a rank's first stage 1.0, its later ones lighter, evenly down to
    above 0.3 however many stages a rank holds (0.65 for the second of two)."""
    place, owned = {}, Counter()  # stage -> its place among its rank's stages
    for stage, rank in enumerate(stage_to_rank or ()):
        place[stage], owned[rank] = owned[rank], owned[rank] + 1
    return {s: 1.0 - 0.7 * k / max(owned[stage_to_rank[s]], 2) for s, k in place.items()}


def legend_entries(
    spans_by_rank: dict, multi: bool, transfer: bool, gaps: str = "idle"
) -> list[tuple[str, str, float]]:
    """(colour key, name, alpha) for what the picture of these spans shows, in legend order
    (``gaps``: what the white between them is)."""
    spans = [sp for r in spans_by_rank for sp in spans_by_rank[r]]
    ops = {sp.action.op.value for sp in spans if sp.kind == "compute"}
    kinds = {"wait" if sp.kind == "drain" else sp.kind for sp in spans} | ({"transfer"} if transfer else set())
    out = [(k, n, 1.0) for k, n in OP_NAMES if k in ops]
    if multi:
        out.append(("F", "lighter: a rank's later stage (cells read stage, op, microbatch)", 0.65))
    out += [(k, n, 1.0) for k, n in COMM_NAMES if k in kinds]
    return out + [("idle", gaps, 1.0)]


def draw_step(
    spans_by_rank: dict,
    path: Path,
    title: str,
    stage_to_rank=None,
    xlabel: str = "time in the step (ms, rank clocks aligned)",
    gaps: str = "idle",
    rank_notes: dict | None = None,
) -> None:
    """``spans_by_rank`` = {rank: [`Span`, ...]} for one step;
    with ``stage_to_rank``, waits are split at the moment the peer posted its send. ``gaps``
    names the white between spans in the legend (a simulated step draws no communication:
    its gaps are communication and idle); ``rank_notes`` = {rank: text} under a rank's name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = sorted(spans_by_rank)
    starts = [sp.start_s for r in ranks for sp in spans_by_rank[r]]
    ends = [sp.end_s for r in ranks for sp in spans_by_rank[r]]
    t0, t1 = min(starts), max(ends)
    span_ms = max((t1 - t0) * 1e3, 1e-6)
    posted = {}  # (receiving rank, start of its wait) -> when the peer posted the send
    if stage_to_rank is not None:
        from ppx.measure.spans import handoffs

        for h in handoffs(spans_by_rank, stage_to_rank):
            posted[(h.peer, h.wait_start_s)] = h.posted_s
    # several stages per rank (interleaved): cells name their stage, and a rank's later stages are lighter
    multi = stage_to_rank is not None and len(stage_to_rank) > len(set(stage_to_rank))
    shade = stage_shades(stage_to_rank)
    handles = [
        Patch(facecolor=COLORS.get(k, "white"), alpha=a, label=n, edgecolor="#BBBBBB" if k == "idle" else None)
        for k, n, a in legend_entries(spans_by_rank, multi, bool(posted), gaps)
    ]
    ncol = min(len(handles), 4)  # (8 entries in a row, as ZB-V's, ran past the picture's edges)
    legend_in = 0.22 * -(-len(handles) // ncol) + 0.1
    fig_h = 0.7 * len(ranks) + 1.3 + legend_in  # inches
    fig, ax = plt.subplots(figsize=(12, fig_h))
    for row, r in enumerate(ranks):
        y = len(ranks) - 1 - row
        ax.add_patch(plt.Rectangle((0, y - 0.4), span_ms, 0.8, facecolor="white", edgecolor="#BBBBBB", lw=0.5))
        for sp in spans_by_rank[r]:
            kind, label, start, end = sp.kind, sp.label, sp.start_s, sp.end_s
            x, w = (start - t0) * 1e3, (end - start) * 1e3
            alpha = 1.0
            if kind == "compute":
                a = sp.action
                color, height = COLORS.get(a.op.value, "#999999"), 0.8
                alpha = shade.get(a.stage, 1.0)
                short = label if multi else f"{a.op.value}{a.mb}"
                if w > span_ms * max(1 / 60, (len(short) + 1) / 200):  # when the text fits (drawn above the cell)
                    ax.text(x + w / 2, y, short, ha="center", va="center", fontsize=7, color="white")
            elif kind in ("post", "reduce"):
                color, height = COLORS[kind], 0.8
            else:
                color, height = COLORS["wait"], 0.5
            ax.add_patch(
                plt.Rectangle(
                    (x, y - height / 2),
                    w,
                    height,
                    facecolor=color,
                    alpha=alpha,
                    edgecolor="white" if kind == "compute" else "none",
                    lw=0.6,
                )
            )
            if kind == "wait" and (r, start) in posted:
                sent = min(max(posted[(r, start)], start), end)
                ax.add_patch(
                    plt.Rectangle(
                        ((sent - t0) * 1e3, y - 0.25),
                        (end - sent) * 1e3,
                        0.5,
                        facecolor=COLORS["transfer"],
                        edgecolor="none",
                    )
                )
    ax.set_xlim(0, span_ms)
    ax.set_ylim(-0.6, len(ranks) - 0.4)
    ax.set_yticks(range(len(ranks)))
    notes = rank_notes or {}
    ax.set_yticklabels([f"rank {r}" + (f"\n{notes[r]}" if r in notes else "") for r in reversed(ranks)])
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    # the legend in a strip of its own under the axis and its label, as tall as its rows
    # whatever the ranks
    fig.tight_layout()
    fig.subplots_adjust(bottom=(legend_in + 0.6) / fig_h)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    save_figure(fig, path, dpi=120, bbox_inches="tight")
