"""report.html: one self-contained page per run and per comparison. Plotly's bundle is inlined
once per page (no CDN, no external font or stylesheet): the file opens from disk in any browser
with the network off. W&B logs the run's page as ``wandb.Html`` (key ``report``).

A run's page (``<body data-page="run">``), what exists of:
  ``#summary``   table, theory against measured (and the simulator's prediction)
  ``#timeline``  the last ``instrument.timeline_steps`` steps (`plotly_figures.timeline_figure`
                 names its traces ``"step K"``, ``"step K posts"``, ``"step K waits"``,
                 ``"step K transfers"``); the div carries ``data-ranks``, ``data-steps``,
                 ``data-last-step`` (K), ``data-last-step-trace`` ("step K"),
                 ``data-last-step-actions`` (compute spans of step K, one bar each) and
                 ``data-arrows`` (hand-offs of step K, one arrow annotation each)
  ``#breakdown`` per-rank compute / comm / idle of the median step against theory's idle
  ``#memory``    per-rank peak saved activations and peak memory
  ``#config``    a ``<pre>`` with config.yaml
A comparison's page (``data-page="compare"``): ``#runs-table`` (a row per run, ``data-runs``
on it), ``#runs`` (step time and bubble per run) and, when the runs vary m, ``#bubble``.
Each figure's div also has the class ``plotly-graph-div``; what was not measured is a
``<p class="missing">`` in its place."""

from __future__ import annotations

import html
import os
from pathlib import Path

from ppx.files import write_whole
from ppx.report.gantt import legend_entries
from ppx.report.split_ways import HEADER, split_rows
from ppx.report.summary_table import setup_words, summary_rows
from ppx.units import count

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1.5em auto;
       max-width: 1400px; padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; }
.wide { overflow-x: auto; max-width: 100%; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
.text { text-align: left; }
th { background: #f4f4f4; }
pre { background: #f7f7f7; padding: 0.8em; font-size: 0.85em; overflow: auto; max-height: 40em; }
.key span { display: inline-block; margin-right: 1.2em; font-size: 0.85em; }
.key i { display: inline-block; width: 1em; height: 0.8em; margin-right: 0.3em; border: 1px solid #bbb; }
.note, .missing { color: #666; font-size: 0.9em; }
"""
PLOTLY_CONFIG = {"displaylogo": False, "scrollZoom": True, "responsive": True}


class _Page:
    """An HTML page being put together; Plotly's bundle goes in with the first figure."""

    def __init__(self, title: str, kind: str):
        self.title, self.kind, self.parts, self.bundled = title, kind, [], False

    def add(self, text: str) -> None:
        self.parts.append(text)

    def heading(self, text: str) -> None:
        self.add(f"<h2>{html.escape(text)}</h2>")

    def figure(self, fig, div_id: str, **data) -> None:
        height = fig.layout.height or 450
        out = fig.to_html(
            include_plotlyjs=not self.bundled,
            full_html=False,
            div_id=div_id,
            include_mathjax=False,
            config=PLOTLY_CONFIG,
            default_height=f"{height}px",
            default_width="100%",
        )
        self.bundled = True
        attrs = "".join(f' data-{k.replace("_", "-")}="{html.escape(str(v))}"' for k, v in data.items())
        tag = f'<div id="{div_id}"'
        assert out.count(tag) == 1, f"{div_id}: not one figure div"
        self.add(out.replace(tag, tag + attrs))

    def missing(self, text: str) -> None:
        self.add(f'<p class="missing">{html.escape(text)}</p>')

    def write(self, path: Path) -> Path:
        page = (
            f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(self.title)}</title>\n<style>{CSS}</style>\n</head>\n"
            f'<body data-page="{self.kind}">\n<h1>{html.escape(self.title)}</h1>\n'
            + "\n".join(self.parts)
            + "\n</body>\n</html>\n"
        )
        write_whole(path, page)
        return path


def _table(table_id: str, header: list[str], rows: list[list[str]], left=(0,), **data) -> str:
    """An HTML table; cells are HTML already, columns ``left`` hold text (left-aligned)."""
    attrs = "".join(f' data-{k}="{html.escape(str(v))}"' for k, v in data.items())
    cls = lambda i: ' class="text"' if i in left else ""  # noqa: E731
    head = "".join(f"<th{cls(i)}>{html.escape(h)}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows)
    # (in a box of its own that scrolls sideways: a comparison's columns ran off a narrow window)
    return f'<div class="wide"><table id="{table_id}"{attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _key(spans_by_rank: dict, multi: bool, transfer: bool) -> str:
    from ppx.report.gantt import COLORS

    items = []
    for k, name, alpha in legend_entries(spans_by_rank, multi, transfer):
        color = COLORS.get(k, "#ffffff")
        items.append(f'<span><i style="background:{color};opacity:{alpha}"></i>{html.escape(name)}</span>')
    return '<p class="key">' + "".join(items) + "</p>"


def write_run_html(
    run_dir: Path,
    summary: dict,
    timeline: list[dict] | None = None,
    stage_to_rank=(),
    config_yaml: str | None = None,
    median: tuple[int, dict] | None = None,
) -> Path:
    """Write ``<run_dir>/report.html`` from the run's summary (summary.json's dict), its
    timeline (`RunReport.timeline`), the stage-to-rank map, config.yaml's text and the median
    step (its index and its summary-like dict, as breakdown.png draws it); what is missing is
    said so on the page."""
    from ppx.report import plotly_figures as figs
    from ppx.report.breakdown import title_of

    page = _Page(f"ppx run: {title_of(summary, setup=False)}", "run")  # (the line under it names the setup)
    v = summary.get("virtual_stages") or 1
    page.add(
        f'<p class="note">{html.escape(str(summary.get("model")))}, {summary.get("stages")} stages'
        f"{f' ({v} per rank)' if v > 1 else ''} on {summary.get('world_size')} ranks "
        f"({html.escape(str(summary.get('device')))}, {html.escape(str(summary.get('backend')))})"
        f"{html.escape(setup_words(summary))}, "
        f"{count(summary.get('steps') or 0, 'step')} of batch {summary.get('batch_size')}: {html.escape(str(summary.get('status')))}. "
        f"Run directory: <code>{html.escape(str(run_dir))}</code></p>"
    )
    page.heading("theory vs measured")
    page.add(
        _table(
            "summary",
            ["", "measured", "predicted (simulator, measured costs)", "theory"],
            [[html.escape(c) for c in row] for row in summary_rows(summary)],
        )
    )
    notes = [summary.get("bubble_theory_basis") and f"Theory: {summary['bubble_theory_basis']}."]
    notes.append(summary.get("bubble_normalisation") and f"Bubble: {summary['bubble_normalisation']}.")
    page.add("".join(f'<p class="note">{html.escape(n)}</p>' for n in notes if n))

    page.heading("timeline of the last steps")
    if timeline:
        fig, facts = figs.timeline_figure(timeline, tuple(stage_to_rank))
        last = timeline[-1]
        multi = len(stage_to_rank) > len(set(stage_to_rank))
        page.add(
            '<p class="note">The last step shown first: drag to zoom, double-click twice for every step, '
            "scroll to zoom, hover a mark for its action, microbatch, stage, start and length. Arrows: the last "
            "step's sends, from the post to the end of the receiving wait.</p>"
        )
        page.figure(fig, "timeline", **facts, last_step_trace=f"step {facts['last_step']}")
        page.add(_key(last["ranks"], multi, facts["arrows"] > 0))
    else:
        page.missing("No timeline: the run had instrument.timers or instrument.timeline off.")

    page.heading("time in the step by rank")
    ranks = summary.get("ranks") or []
    if median is not None:
        k, step = median
        even = len(summary.get("step_times_s") or []) % 2 == 0
        which = ", of an even count the slower of the two middle ones" if even else ""
        page.add(f'<p class="note">Step {k}, the median step{which} (its parts add up to its step time).</p>')
        page.figure(figs.breakdown_figure(step), "breakdown")
    else:
        page.missing("No breakdown: the run had instrument.timers off.")

    page.heading("memory by rank")
    mem = figs.memory_figure(ranks)
    if mem is not None:
        page.figure(mem, "memory")
    else:
        page.missing("No memory measured: instrument.memory was off.")

    split = split_rows(summary)
    if split:
        page.heading("split backward by stage")
        page.add(
            '<p class="note">How each stage split its backward into I and W (train.split_backward): '
            "store keeps each Linear layer's input and output gradient from I to W and drops the graph; "
            "graph keeps the graph and walks it again in W; whole runs the whole backward in the I. "
            "I frees: the share of a microbatch's saved bytes its I releases.</p>"
        )
        page.add(_table("split", HEADER, [[html.escape(c) for c in row] for row in split], left=(0, 1, 3, 5)))
    if summary.get("paired"):
        from ppx.measure.paired import PAIRED_HEADER, paired_rows

        page.heading("configs beside the run")
        page.add(
            '<p class="note">run.paired: each config ran step by step beside the run, in its processes; its steps '
            "over the run's step beside each (median, middle half, a 95% interval of the median), and its losses "
            "against the run's at every step. An entry that is the run's own config is the floor: every other "
            "entry's steps over its steps beside them too.</p>"
        )
        rows = [[html.escape(c) for c in row] for row in paired_rows(summary["paired"])]
        page.add(_table("paired", PAIRED_HEADER, rows, left=(0, 5, 6, 7)))
    page.heading("config")
    page.add(f'<pre id="config">{html.escape(config_yaml or "(no config.yaml)")}</pre>')
    return page.write(run_dir / "report.html")


def write_compare_html(
    out_dir: Path,
    rows: list[dict],
    columns,
    title: str,
    series: list[dict] | None,
    notes: list[str] = (),
    tables: list[tuple[str, list[str], list[list[str]]]] = (),
) -> Path:
    """Write ``<out_dir>/report.html`` for compare's ``rows`` (with ``columns``, compare's
    (header, key, format) list), a title, the bubble-against-m series (or None), the notes
    printed under the table (its legend, what it cannot order) and more ``tables`` (heading,
    header, text rows: repeated paired jobs pooled)."""
    from ppx.report import plotly_figures as figs

    page = _Page(f"ppx compare: {title}", "compare")
    page.heading("runs")
    body = []
    text = {"name", "label", "schedule", "model"}
    for r in rows:
        cells = []
        for _, key, fmt in columns:
            value = "-" if r.get(key) is None else html.escape(fmt.format(r[key]))
            if key == "name" and (Path(r["path"]) / "report.html").exists():
                href = os.path.relpath(Path(r["path"]) / "report.html", out_dir)
                value = f'<a href="{html.escape(href)}">{value}</a>'
            cells.append(value)
        body.append(cells)
    left = [i for i, (_, key, _) in enumerate(columns) if key in text]
    page.add(_table("runs-table", [h for h, _, _ in columns], body, left=left, runs=len(rows)))
    page.add('<p class="note">Each run\'s name links to its own report.html where it has one.</p>')
    for note in notes:
        page.add(f'<p class="note">{html.escape(note)}</p>')
    for k, (heading, header, body) in enumerate(tables):
        page.heading(heading)
        page.add(_table(f"pooled-{k}", header, [[html.escape(c) for c in r] for r in body], left=(0, 1, 3, 6)))
    page.figure(figs.runs_figure(rows), "runs")
    page.heading("bubble against microbatches")
    if series:
        page.figure(figs.bubble_figure(series), "bubble")
    else:
        page.missing("The runs do not vary the microbatch count m (or one has no measured bubble).")
    return page.write(out_dir / "report.html")
