"""The Plotly figures of report.html (`ppx.report.html_report` lays them out): the timeline of
the last steps, the per-rank breakdown against theory, memory per rank, and for comparisons the
runs side by side and the bubble against m. Colours and names are the PNGs' (`gantt`,
`breakdown`, `compare`).

The timeline's traces, in this order and all of them bars (so the i-th ``.barlayer .trace``
of the rendered page is the i-th trace): per step shown, ``"step K"`` (one bar per compute
span), then where there are any ``"step K posts"`` (send/receive posts), ``"step K waits"``
(waits and the end-of-step drain) and ``"step K transfers"`` (the part of a wait after the
peer posted). The last step's hand-offs are layout annotations with arrows, from the send's
post on the sender's row to the end of the receiving wait on the receiver's row; the figure
has no other annotations (step starts are shapes)."""

from __future__ import annotations

import html

from ppx.measure.spans import handoffs
from ppx.report.breakdown import THEORY_COLOR, parts_of, rank_theories, theory_label
from ppx.report.compare import bubble_bars, picture_labels
from ppx.report.gantt import COLORS, stage_shades
from ppx.units import byte_unit

FONT = dict(family="system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif", size=12)


def _layout(fig, **kw) -> None:
    fig.update_layout(template="plotly_white", font=FONT, margin=dict(l=70, r=20, t=50, b=50), **kw)


def timeline_figure(steps: list[dict], stage_to_rank) -> tuple[object, dict]:
    """``steps`` = RunReport.timeline ([{"step", "step_time_s", "ranks": {rank: [Span, ...]}}],
    times on rank 0's clock) -> (figure, facts: ranks, last_step, last_step_actions, arrows)."""
    import plotly.graph_objects as go

    ranks = sorted({r for s in steps for r in s["ranks"]})
    rows = [f"rank {r}" for r in ranks]
    row_of = {r: i for i, r in enumerate(ranks)}
    origin = min(sp.start_s for s in steps for spans in s["ranks"].values() for sp in spans)
    ms = lambda t: (t - origin) * 1e3  # noqa: E731
    multi = len(stage_to_rank) > len(set(stage_to_rank))
    shade = stage_shades(stage_to_rank)  # a rank's later stages lighter
    fig = go.Figure()
    shapes = []
    for s in steps:
        name = f"step {s['step']}"
        marks = _step_marks(s, stage_to_rank, ms, multi)
        _add_compute(fig, name, marks.pop("compute"), shade)
        _add_others(fig, name, marks)
        shapes.append(_step_line(s, name, ms))
    last = steps[-1]
    arrows = _handoff_arrows(last, stage_to_rank, ms, row_of)
    _layout(
        fig,
        barmode="overlay",
        height=140 + 55 * len(ranks),
        dragmode="zoom",
        hovermode="closest",
        shapes=shapes,
        annotations=arrows,
        uniformtext=dict(minsize=8, mode="hide"),
        showlegend=False,  # (the page's key names the colours: a legend entry per step showed its first bar's blue)
        xaxis=dict(
            title="ms from the first shown step's start (rank clocks aligned to rank 0's)",
            zeroline=False,
            range=_around(last, ms),  # the last step in view; double-click twice: every step shown
        ),
        yaxis=dict(categoryorder="array", categoryarray=rows, autorange="reversed", type="category"),
    )
    facts = {
        "ranks": len(ranks),
        "steps": len(steps),
        "last_step": last["step"],
        "last_step_actions": sum(sp.kind == "compute" for spans in last["ranks"].values() for sp in spans),
        "arrows": len(arrows),
    }
    return fig, facts


def _step_marks(s: dict, stage_to_rank, ms, multi: bool) -> dict[str, list[tuple]]:
    """One step's marks by kind (compute, posts, reduces, waits, transfers): (row, start ms,
    length ms, the action or label[, the compute's text]); a wait's transfer from its send's post."""
    marks: dict[str, list[tuple]] = {k: [] for k in ("compute", "posts", "reduces", "waits", "transfers")}
    posted = {(h.peer, h.wait_start_s): h.posted_s for h in handoffs(s["ranks"], stage_to_rank)}
    for r in sorted(s["ranks"]):
        for sp in s["ranks"][r]:
            row, start, length = f"rank {r}", ms(sp.start_s), sp.duration_s * 1e3
            if sp.kind == "compute":
                a = sp.action
                marks["compute"].append((row, start, length, a, sp.label if multi else f"{a.op.value}{a.mb}"))
            elif sp.kind in ("post", "reduce"):
                marks[sp.kind + "s"].append((row, start, length, sp.label))
            else:
                marks["waits"].append((row, start, length, sp.label))
                if (r, sp.start_s) in posted:
                    sent = min(max(posted[(r, sp.start_s)], sp.start_s), sp.end_s)
                    marks["transfers"].append((row, ms(sent), (sp.end_s - sent) * 1e3, sp.label))
    return marks


def _add_compute(fig, name: str, compute: list[tuple], shade: dict) -> None:
    """A step's compute actions: one bar trace, coloured by op, a rank's later stages lighter."""
    fig.add_bar(
        name=name,
        y=[c[0] for c in compute],
        base=[c[1] for c in compute],
        x=[c[2] for c in compute],
        width=0.8,
        marker=dict(
            color=[COLORS.get(c[3].op.value, "#999999") for c in compute],
            opacity=[shade.get(c[3].stage, 1.0) for c in compute],
            line=dict(color="white", width=0.6),
        ),
        text=[c[4] for c in compute],
        textposition="inside",
        insidetextanchor="middle",
        textangle=0,
        customdata=[[str(c[3]), c[3].mb, c[3].stage, c[1], c[2]] for c in compute],
        hovertemplate=(
            "<b>%{customdata[0]}</b> (" + name + ", %{y})<br>microbatch %{customdata[1]}, stage "
            "%{customdata[2]}<br>start %{customdata[3]:.3f} ms<br>length %{customdata[4]:.3f} ms<extra></extra>"
        ),
        legendgroup=name,
        orientation="h",
    )


def _add_others(fig, name: str, marks: dict[str, list[tuple]]) -> None:
    """A step's posts, reductions, waits and transfers: a trace each, grouped with the step's compute."""
    for what, color, width in (
        ("posts", COLORS["post"], 0.8),
        ("reduces", COLORS["reduce"], 0.8),
        ("waits", COLORS["wait"], 0.5),
        ("transfers", COLORS["transfer"], 0.5),
    ):
        spans = marks[what]
        if spans:
            fig.add_bar(
                name=f"{name} {what}",
                y=[c[0] for c in spans],
                base=[c[1] for c in spans],
                x=[c[2] for c in spans],
                width=width,
                marker=dict(color=color, opacity=0.75),
                customdata=[[c[3], c[1], c[2]] for c in spans],
                hovertemplate=(
                    f"{what[:-1]}: %{{customdata[0]}} ({name}, %{{y}})<br>start %{{customdata[1]:.3f}} ms<br>"
                    "length %{customdata[2]:.3f} ms<extra></extra>"
                ),
                showlegend=False,
                legendgroup=name,
                orientation="h",
            )


def _step_line(s: dict, name: str, ms) -> dict:
    """A dotted line where step ``s`` starts, labelled with its name."""
    start = min(sp.start_s for spans in s["ranks"].values() for sp in spans)
    return dict(
        type="line",
        x0=ms(start),
        x1=ms(start),
        yref="paper",
        y0=0,
        y1=1,
        line=dict(color="#888888", width=1, dash="dot"),
        label=dict(text=name, textposition="end", font=dict(size=10, color="#666666")),
    )


def _handoff_arrows(step: dict, stage_to_rank, ms, row_of: dict) -> list[dict]:
    """An arrow per hand-off of ``step``: from its send's post to the end of its wait."""
    return [
        dict(
            x=ms(h.wait_end_s),
            y=row_of[h.peer],
            ax=ms(h.posted_s),
            ay=row_of[h.rank],
            xref="x",
            yref="y",
            axref="x",
            ayref="y",
            text="",
            showarrow=True,
            arrowhead=2,
            arrowsize=1,
            arrowwidth=1,
            arrowcolor="rgba(60,60,60,0.6)",
            hovertext=(
                f"{h.send}: rank {h.rank} to rank {h.peer}, posted {ms(h.posted_s):.3f} ms, "
                f"received {ms(h.wait_end_s):.3f} ms"
            ),
        )
        for h in handoffs(step["ranks"], stage_to_rank)
    ]


def _around(step: dict, ms) -> list[float]:
    """The x range of one step's spans, with a margin (time between steps can dwarf them)."""
    spans = [sp for spans in step["ranks"].values() for sp in spans]
    t0, t1 = ms(min(sp.start_s for sp in spans)), ms(max(sp.end_s for sp in spans))
    pad = 0.03 * max(t1 - t0, 1e-6)
    return [t0 - pad, t1 + pad]


def breakdown_figure(summary: dict) -> object:
    """Per rank, stacked compute / communication / idle ms of one step (``summary`` is the
    median step's, as breakdown.png draws it), against its step time and theory's idle."""
    import plotly.graph_objects as go

    ranks = summary["ranks"]
    xs = [f"rank {r['rank']}" for r in ranks]
    step_ms = summary["step_time_s"] * 1e3
    theory = summary.get("bubble_fraction_theory")
    fig = go.Figure()
    for key, name, color in [*parts_of(ranks), ("idle_s", "idle", "#D9D9D9")]:
        vals = [(r.get(key) or 0.0) * 1e3 for r in ranks]
        share = [v / step_ms if step_ms > 0 else 0.0 for v in vals]
        fig.add_bar(
            name=name,
            x=xs,
            y=vals,
            marker_color=color,
            customdata=share,
            hovertemplate=f"{name}: %{{y:.3f}} ms (%{{customdata:.1%}} of the step)<extra>%{{x}}</extra>",
        )
    if theory is not None:  # in theory the top `th` of the step is idle on a rank
        fig.add_scatter(
            name=theory_label(summary, f"{theory:.1%}").replace(" line", ""),
            x=xs,
            y=[step_ms * (1 - th) for th in rank_theories(summary)],
            mode="markers",
            marker=dict(symbol="line-ew-open", size=60, color=THEORY_COLOR, line=dict(width=3)),
            hovertemplate="theory: busy up to %{y:.3f} ms<extra>%{x}</extra>",
        )
    fig.add_hline(y=step_ms, line=dict(color="black", width=1.2), annotation_text=f"step time {step_ms:.2f} ms")
    legend = dict(orientation="h", y=-0.15, traceorder="normal")
    _layout(fig, barmode="stack", height=420, yaxis_title="ms in the step", legend=legend)
    return fig


def memory_figure(ranks: list[dict]) -> object | None:
    """Per rank, peak saved activations and peak memory (in-flight microbatches on hover);
    None when neither was measured."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = [
        ("peak_activation_bytes", "peak saved activations", COLORS["B"]),
        ("peak_memory_bytes", "peak memory (CUDA allocated / CPU resident)", COLORS["F"]),
    ]
    panels = [p for p in panels if any(r.get(p[0]) is not None for r in ranks)]
    if not panels:
        return None
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[title for _, title, _ in panels])
    xs = [f"rank {r['rank']}" for r in ranks]
    inflight = [r.get("peak_inflight_microbatches") for r in ranks]
    for col, (key, title, color) in enumerate(panels, start=1):
        top = max(r.get(key) or 0 for r in ranks)
        unit, size = byte_unit(top)
        fig.add_trace(
            go.Bar(
                name=title,
                x=xs,
                y=[(r.get(key) or 0) / size for r in ranks],
                marker_color=color,
                customdata=[["-" if n is None else n] for n in inflight],
                hovertemplate=f"%{{y:.2f}} {unit}<br>peak in-flight microbatches %{{customdata[0]}}<extra>%{{x}}</extra>",
                showlegend=False,
            ),
            row=1,
            col=col,
        )
        # (all 0, a forward-only run's activations: 0 to 1, where Plotly's own range ran from -1)
        fig.update_yaxes(title_text=unit, rangemode="tozero", range=None if top else [0, 1], row=1, col=col)
    _layout(fig, height=360)
    return fig


def runs_figure(rows: list[dict]) -> object:
    """Runs side by side (compare's rows): step time, and measured / predicted / theory bubble."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    labels, key = picture_labels(rows)
    full = [r.get("label") or r["name"] for r in rows]  # (on hover, numbered or not)
    fig = make_subplots(rows=1, cols=2, subplot_titles=["step time (ms)", "bubble (idle / step time)"])
    step = [r["step_ms"] for r in rows]
    fig.add_trace(
        go.Bar(name="step time", x=labels, y=step, hovertext=full, marker_color=COLORS["F"], showlegend=False),
        row=1,
        col=1,
    )
    for name, values, color in bubble_bars(rows):
        fig.add_trace(go.Bar(name=name, x=labels, y=values, hovertext=full, marker_color=color), row=1, col=2)
    fig.update_yaxes(tickformat=".0%", row=1, col=2)
    fig.update_xaxes(tickangle=0 if key else None, automargin=True)  # (#k flat; names as Plotly slants them)
    # the legend above the panels (under them it sat on the runs' names), the key of numbered runs under them
    _layout(fig, barmode="group", height=440 + 18 * len(key), legend=dict(orientation="h", y=1.2, x=1, xanchor="right"))
    fig.update_layout(margin=dict(t=90, b=60 + 18 * len(key)))
    if key:
        text = "<br>".join(html.escape(line) for line in key)
        at = dict(xref="paper", yref="paper", x=0, y=0, yshift=-40, yanchor="top", xanchor="left", align="left")
        fig.add_annotation(text=text, showarrow=False, **at)
    return fig


def bubble_figure(series: list[dict]) -> object:
    """Bubble against m (`ppx.report.compare.bubble_series`): the closed form dashed, measured
    dots, predicted crosses, each run's theory rings, one colour per (schedule, p, v)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    ms = sorted({m for s in series for m, _ in s["measured"]})
    for k, s in enumerate(series):
        if s["theory"]:  # dashes of their own, as bubble.png's: equal curves stay told apart
            m, t = zip(*s["theory"])
            dash = f"4px,{2 + 2 * k}px"
            fig.add_scatter(name=f"{s['name']} theory", x=m, y=t, mode="lines", line=dict(color=s["color"], dash=dash))
        marks = (("measured", "", 9, "circle"), ("predicted", " predicted", 9, "x"))
        for key, suffix, size, symbol in (*marks, ("run_theory", " the run's theory", 14, "circle-open")):
            if s.get(key):
                m, y = zip(*s[key])
                marker = dict(color=s["color"], size=size, symbol=symbol)
                fig.add_scatter(name=f"{s['name']}{suffix}", x=m, y=y, mode="markers", marker=marker)
    from ppx.report.compare import TITLE

    _layout(
        fig,
        height=460,
        title=dict(text=TITLE.replace("\n", "<br>"), font_size=13),
        xaxis=dict(type="log", title="microbatches m", tickvals=ms, ticktext=[str(m) for m in ms]),
        yaxis=dict(title="bubble (idle / step time)", range=[0, 1], tickformat=".0%"),
    )
    return fig
