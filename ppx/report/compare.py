"""`ppx compare`: runs side by side, as a terminal table, a markdown table and a PNG, plus
the classic bubble-versus-microbatches picture when the runs vary the microbatch count, and
all of it in one self-contained report.html (`ppx.report.html_report`)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from ppx import schedules
from ppx.errors import UserError
from ppx.files import save_figure, write_json, write_whole
from ppx.measure.metrics import middle_half
from ppx.report.compare_notes import (
    POOLED_HEADER,
    job_paired,
    listed,
    noise_notes,
    note_names,
    paired_notes,
    pooled_groups,
    pooled_json,
    pooled_notes,
    pooled_table,
)
from ppx.report.found_runs import find_runs
from ppx.report.labels import flat_config, run_labels, shared_label
from ppx.report.run_dir import RunDir

COLUMNS = [  # (header, key, format)
    ("run", "name", "{}"),
    ("label", "label", "{}"),
    ("schedule", "schedule", "{}"),
    ("p", "world_size", "{}"),
    ("m", "microbatches", "{}"),
    ("model", "model", "{}"),
    ("step ms", "step_ms", "{:.2f}"),
    ("steps q1-q3 ms", "step_range", "{}"),
    ("samples/s", "throughput", "{:.1f}"),
    ("bubble", "bubble", "{:.1%}"),
    ("timeline bubble", "timeline_bubble", "{:.1%}"),
    ("predicted", "predicted", "{:.1%}"),
    ("pred err pt", "predicted_error_pt", "{:+.1f}"),
    ("theory", "theory", "{:.1%}"),
    ("peak act KiB", "peak_act_kib", "{:.1f}"),
    ("peak mem MiB", "peak_mem_mib", "{:.0f}"),
    ("final loss", "final_loss", "{:.4f}"),
]


NOTE = (  # under both tables: pred err pt is the timeline bubble minus the predicted one, not the bubble's
    "step ms = the median step; steps q1-q3 = the middle half of the run's steps; "
    "bubble = measured idle / step time (median over steps); timeline bubble = idle / step time over the "
    "timeline's steps, whose action costs the prediction takes; predicted = the simulator's bubble from those "
    "costs; pred err pt = timeline bubble minus predicted, in points; theory = the schedule's formula with equal per-stage costs, or on the "
    "known-cost model the exact value at its costs (bubble_theory_basis)."
)


def load_row(run: RunDir, base: Path | None = None) -> dict:
    s, path = run.summary, run.path
    name = str(path.relative_to(base)) if base and path.is_relative_to(base) and path != base else str(path)
    return {
        "name": name,
        "path": str(path),
        "schedule": s.schedule,
        "world_size": s.world_size,
        "microbatches": s.microbatches,
        "model": s.model,
        "step_ms": s.step_time_s * 1e3,
        "step_range": _middle_half(s.step_times_s),
        "throughput": s.throughput,
        "bubble": s.bubble_fraction,
        "theory": s.bubble_fraction_theory,
        "timeline_bubble": s.measured_bubble_fraction,
        "predicted": s.predicted_bubble_fraction,
        "v": s.virtual,
        "predicted_error_pt": _points(s.prediction_error_bubble_fraction),
        "peak_act_kib": None if s.peak_activation_bytes is None else s.peak_activation_bytes / 1024,
        "peak_mem_mib": None if s.peak_memory_bytes is None else s.peak_memory_bytes / 2**20,
        "final_loss": s.final_loss,
    }


def _middle_half(steps_s) -> str | None:
    """'q1-q3' of a run's step times in ms (its middle half: the quartiles, inclusive), or None
    with fewer than 4 finite steps (a range of 2 or 3 would be its extremes, its first step's
    one-off costs among them)."""
    half = middle_half(x * 1e3 for x in steps_s or () if isinstance(x, (int, float)) and math.isfinite(x))
    return None if half is None else f"{half[0]:.2f}-{half[1]:.2f}"


def _points(x):
    return None if x is None else 100 * x


def _cells(row: dict) -> list[str]:
    return ["-" if row.get(k) is None else fmt.format(row[k]) for _, k, fmt in COLUMNS]


def text_table(rows: list[dict]) -> str:
    left = {k for k, (_, key, _) in enumerate(COLUMNS) if key in ("name", "label")}  # the text columns
    return "\n".join([_aligned([h for h, _, _ in COLUMNS], [_cells(r) for r in rows], left), NOTE])


def _aligned(header: list[str], body: list[list[str]], left: set[int]) -> str:
    """A terminal table: columns ``left`` (indices) left-aligned, the rest right-aligned."""
    table = [header, *body]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        for r in table
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _md_rows(header: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in body]


def markdown_table(rows: list[dict]) -> str:
    out = _md_rows([h for h, _, _ in COLUMNS], [_cells(r) for r in rows])
    out.append("")
    out.append(NOTE)
    return "\n".join(out) + "\n"


def plot_runs(rows: list[dict], path: Path, title: str = "") -> None:
    """Five bar panels (step time, throughput, bubble, peak memory, peak activations), each
    run's bar named by its label; the sixth panel holds the bubble panel's colour legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = list(range(len(rows)))
    width = max(11.0, 0.5 * len(rows) + 8)
    # a label wider than its bar's share of a panel (in characters of the 8-point tick font,
    # about 0.075 inch each) is wrapped at its spaces, and drawn slanted if a line is still wider;
    # the figure grows by what the labels need under each row of panels
    room = 0.85 * width / 3 / len(rows)  # inches of panel width per bar
    fits = max(int(room / 0.075), 12)
    names, spelt = picture_labels(rows)
    labels = [textwrap.fill(t, fits, break_long_words=False, break_on_hyphens=False) for t in names]
    lines = max(t.count("\n") + 1 for t in labels)
    longest = max(len(line) for t in labels for line in t.splitlines())
    rotate = longest * 0.075 > room
    grow = 2 * (lines - 1) * 0.14 + (2 * longest * 0.075 * math.sin(math.radians(35)) if rotate else 0.0)
    fig, axes = plt.subplots(2, 3, figsize=(width, 7 + grow))
    panels = [
        (axes[0][0], "step time (ms)", [r["step_ms"] for r in rows]),
        (axes[0][1], "throughput (samples/s)", [r["throughput"] or 0 for r in rows]),
        (
            axes[1][1],
            "peak memory (MiB)\nCUDA allocated, or resident set on CPU",
            [r["peak_mem_mib"] or 0 for r in rows],
        ),
        (axes[1][2], "peak saved activations (KiB)\nbusiest rank", [r["peak_act_kib"] or 0 for r in rows]),
    ]
    for ax, name, values in panels:
        ax.bar(x, values, color="#4C72B0")
        ax.set_title(name, fontsize=10)
    ax = axes[1][0]
    nan = float("nan")  # (no bar, where a run has no such figure: a run without timers)
    for shift, (name, values, color) in zip((-0.27, 0.0, 0.27), bubble_bars(rows)):
        ax.bar([i + shift for i in x], [nan if v is None else v for v in values], width=0.27, label=name, color=color)
        for i, v in enumerate(values):
            if v is None:
                ax.text(i + shift, 0, "n/a", ha="center", va="bottom", fontsize=6, rotation=90, color="#777777")
    ax.set_ylim(bottom=0)  # (every bar missing: matplotlib's own range ran below 0)
    ax.set_title("bubble (idle / step time)", fontsize=10)
    for a in (axes[0][0], axes[0][1], axes[1][0], axes[1][1], axes[1][2]):
        a.set_xticks(x)
        if rotate:
            a.set_xticklabels(labels, fontsize=8, rotation=35, ha="right", rotation_mode="anchor")
        else:
            a.set_xticklabels(labels, fontsize=8)
    key = axes[0][2]
    key.axis("off")
    handles, legend_labels = ax.get_legend_handles_labels()
    key.legend(handles, [f"bubble: {t}" for t in legend_labels], loc="center left", fontsize=9, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    if spelt:  # numbered runs, spelt out under the panels
        fig.text(0.01, 0, "\n".join(spelt), va="top", ha="left", fontsize=8)
    save_figure(fig, path, dpi=110, bbox_inches="tight")


LABEL_FITS = 40  # characters: a longer label is numbered in the pictures, and spelt out in their key
MEASURED_BUBBLE = "measured (timeline steps)"  # (the table's bubble column is the median over all steps)


def bubble_bars(rows: list[dict]) -> list[tuple[str, list, str]]:
    """The bubble panel's (name, each run's value or None, colour), as both pictures draw it."""
    return [
        (measured_name(rows), [measured_beside_prediction(r) for r in rows], "#DD8452"),
        ("predicted (simulator)", [r["predicted"] for r in rows], "#8172B2"),
        ("theory", [r["theory"] for r in rows], "#BBBBBB"),
    ]


def measured_name(rows: list[dict]) -> str:
    """The measured bubble's name in a picture of ``rows``: the timeline steps', and the
    median over all steps where a run has no timeline (`measured_beside_prediction`)."""
    if all(r.get("timeline_bubble") is not None or r.get("bubble") is None for r in rows):
        return MEASURED_BUBBLE
    return "measured (timeline steps; all steps without a timeline)"


def picture_labels(rows: list[dict]) -> tuple[list[str], list[str]]:
    """(each run's name under its bars, the key that spells out numbered ones): the labels as
    they are where each fits in LABEL_FITS characters, else #1..#n and '#k  <label>' lines
    (runs apart in many keys: their labels, slanted and wrapped, ran over each other)."""
    labels = [r.get("label") or r["name"] for r in rows]
    if max(map(len, labels)) <= LABEL_FITS:
        return labels, []
    return [f"#{k}" for k in range(1, len(rows) + 1)], [f"#{k}  {t}" for k, t in enumerate(labels, 1)]


def measured_beside_prediction(row: dict) -> float | None:
    """The measured bubble a picture draws beside the prediction: the timeline steps' (the
    steps whose costs the prediction takes, as the table's pred err pt), or the median over
    the run's steps where it has no timeline (and then no prediction)."""
    return row["bubble"] if row.get("timeline_bubble") is None else row["timeline_bubble"]


TITLE = (  # bubble.png's and report.html's
    "measured bubble of the timeline steps (dots), predicted from their costs (x), the run's theory (rings),\n"
    "closed form at equal costs (dashed)"
)
SERIES_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B2", "#937860", "#DA8BC3"]


def bubble_series(rows: list[dict]) -> list[dict] | None:
    """The bubble-against-m picture's data, one series per (schedule, p, v): its ``name`` and
    ``color``, the ``theory`` curve at every m up to the largest (``[(m, bubble)]``: the
    family's closed form at equal costs, where it has one), the ``measured`` and ``predicted``
    points, and each run's own theory (``run_theory``: the table's, exact at the known-cost
    model's costs, which need not be equal). None when the runs do not vary microbatches (or
    one has no bubble). bubble.png and report.html draw the same series."""
    if len({r["microbatches"] for r in rows}) < 2 or any(r["bubble"] is None for r in rows):
        return None
    dense = range(1, max(r["microbatches"] for r in rows) + 1)
    out = []
    for k, key in enumerate(sorted({(r["schedule"], r["world_size"], r["v"]) for r in rows})):
        sched, p, v = key
        pts = sorted(
            (r["microbatches"], measured_beside_prediction(r), r["predicted"], r["theory"])
            for r in rows
            if (r["schedule"], r["world_size"], r["v"]) == key
        )
        theory = [(m, schedules.theory_bubble(sched, p, m, v)) for m in dense]
        out.append(
            {
                "name": f"{sched} (p={p}{f', v={v}' if v > 1 else ''})",
                "color": SERIES_COLORS[k % len(SERIES_COLORS)],
                "theory": [(m, t) for m, t in theory if t is not None],
                "measured": [(m, b) for m, b, _, _ in pts],
                "predicted": [(m, pr) for m, _, pr, _ in pts if pr is not None],
                "run_theory": [(m, t) for m, _, _, t in pts if t is not None],
            }
        )
    return out


def plot_bubble_vs_microbatches(rows: list[dict], path: Path) -> bool:
    """Measured bubble against microbatches, one colour per schedule, over the theoretical
    curves. Returns False (and draws nothing) when the runs do not vary microbatches."""
    series = bubble_series(rows)
    if series is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ms = sorted({r["microbatches"] for r in rows})
    for k, s in enumerate(series):
        color = s["color"]
        if s["theory"]:
            ax.plot(*zip(*s["theory"]), color=color, lw=1.2, ls=(0, (4, 2 + 2 * k)), alpha=0.7)
        ax.plot(*zip(*s["measured"]), "o", color=color, label=s["name"])
        if s["predicted"]:
            ax.plot(*zip(*s["predicted"]), "x", color=color, ms=7)
        if s["run_theory"]:
            ax.plot(*zip(*s["run_theory"]), "o", color=color, ms=11, mfc="none", mew=1.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms)
    ax.set_xticklabels([str(m) for m in ms])
    ax.set_xlabel("microbatches m")
    ax.set_ylabel("bubble (idle / step time)")
    ax.set_ylim(0, 1)
    ax.set_title(TITLE, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return True


def _commit(run: RunDir) -> str | None:
    """The ppx commit a run was made by (env.json's), or None where it has none to read."""
    try:
        return ((run.env or {}).get("git") or {}).get("commit")
    except (OSError, ValueError, AttributeError):
        return None


def compare(patterns: list[str], out: Path | None, pages: bool = True) -> str:
    """Write compare.md, compare.json and, with ``pages``, compare.png (and bubble.png) and
    report.html to ``out`` (which must not hold a comparison yet; None: nothing written, as
    ``ppx compare --print-only``); return the terminal table."""
    left: list[Path] = []
    runs = find_runs(patterns, left)
    base = Path(patterns[0]) if len(patterns) == 1 and Path(patterns[0]).is_dir() else None
    rows = [load_row(r, base) for r in runs]
    configs = [flat_config(r) for r in runs]
    labels = run_labels(configs, [r["name"] for r in rows])
    rows = [{"name": r["name"], "label": lab, **r} for r, lab in zip(rows, labels)]
    if out is not None and (out / "compare.md").exists():
        raise UserError(f"{out} already holds a comparison; ppx never overwrites one (choose another --out)")
    paired, names = [job_paired(r) for r in runs], note_names(rows)
    groups = pooled_groups(paired, configs)
    pooled = {k for group, _ in groups for k in group}  # (their note lists each job's ratio, pooled)
    notes = noise_notes(rows, configs) + paired_notes([{} if k in pooled else p for k, p in enumerate(paired)], names)
    notes += pooled_notes(groups, names, [_commit(r) for r in runs])
    if left:  # (the table has no row for them: say which)
        where = [str(p.relative_to(base)) if base and p.is_relative_to(base) else str(p) for p in left]
        notes.append(f"note: left out {len(left)} run(s) that did not complete: {listed(where, most=6)}")
    tables = [  # each pooled group's entries: (its heading, header, rows)
        (f"run.paired pooled over {listed([names[k] for k in g], most=6)}", POOLED_HEADER, pooled_table(p))
        for g, p in groups
    ]
    if out is not None:
        _write(out, rows, configs, notes, tables, paired, groups, names, pages)
    pooled = [f"{t}:\n" + _aligned(h, body, {0, 1, 3, 6}) for t, h, body in tables]  # (the notes' figures, as a table)
    return "\n".join([text_table(rows), *notes, *pooled])


def _write(out: Path, rows, configs, notes, tables, paired, groups, names, pages: bool) -> None:
    """A comparison's files in ``out`` (`compare`)."""
    out.mkdir(parents=True, exist_ok=True)
    md = "".join(f"\n## {t}\n\n" + "\n".join(_md_rows(h, body)) + "\n" for t, h, body in tables)
    write_whole(out / "compare.md", markdown_table(rows) + "".join(f"\n{n}\n" for n in notes) + md)
    write_json(out / "compare.json", rows)
    if any(paired):  # each paired run's entries, and repeated paired jobs pooled
        write_json(out / "paired.json", pooled_json(paired, groups, names))
    shared = shared_label(configs)
    title = "1 run" if len(rows) == 1 else f"{len(rows)} runs" + (f"; all: {shared}" if shared else "")
    if pages:  # (a sweep whose runs drew no pages draws none either: logging.report=false)
        plot_runs(rows, out / "compare.png", title)
        plot_bubble_vs_microbatches(rows, out / "bubble.png")
        from ppx.report.html_report import write_compare_html

        write_compare_html(out, rows, COLUMNS, title, bubble_series(rows), [NOTE, *notes], tables)
