"""compare.png and report.html's runs figure name each run readably: labels as they are where
they fit, numbered and spelt out under the panels where runs differ in many keys (their long
labels, slanted and wrapped, ran over each other and under the legend); the measured bubble
is named as the timeline steps'; a run without a figure gets no bar (it drew one of 0)."""

from ppx.report.compare import LABEL_FITS, MEASURED_BUBBLE, picture_labels, plot_runs
from ppx.report.plotly_figures import runs_figure

LONG = "1f1b p=2 m=4 model=mlp layers=4 data=1 batch_size=32 lr=0.01 optimizer=sgd dtype="


def rows(labels, timers=True):
    figures = {"bubble": 0.26, "timeline_bubble": 0.25, "predicted": 0.2} if timers else {}
    base = {"step_ms": 4.0, "throughput": 8000.0, "peak_mem_mib": 300.0, "peak_act_kib": 16.0, "theory": 0.2}
    return [
        {"name": f"r{k}", "label": t, "bubble": None, "timeline_bubble": None, "predicted": None} | base | figures
        for k, t in enumerate(labels)
    ]


def test_short_labels_stay_and_long_ones_are_numbered_with_a_key():
    assert picture_labels(rows(["1f1b", "zb_h1"])) == (["1f1b", "zb_h1"], [])
    long = [LONG + "fp32", LONG + "bf16"]
    assert len(long[0]) > LABEL_FITS
    assert picture_labels(rows(long)) == (["#1", "#2"], [f"#1  {long[0]}", f"#2  {long[1]}"])
    assert picture_labels([{"name": "a", "label": ""}]) == (["a"], [])  # (no label: the run's name)


def test_the_measured_bubble_is_named_for_the_steps_it_is_of():
    from ppx.report.compare import measured_name

    timed, untimed = rows(["a"]), rows(["b"], timers=False)
    assert measured_name(timed + untimed) == MEASURED_BUBBLE  # (a run without timers: no figure at all)
    no_timeline = [{**timed[0], "timeline_bubble": None}]  # (a median over all steps, no timeline)
    assert measured_name(timed + no_timeline) == "measured (timeline steps; all steps without a timeline)"


def test_the_html_figure_numbers_long_labels_spells_them_out_and_keeps_a_missing_bubble_missing():
    long = [LONG + "fp32", LONG + "bf16", LONG + "fp16"]
    fig = runs_figure(rows(long[:2]) + rows(long[2:], timers=False))
    bars = {t.name: t for t in fig.data}
    assert list(bars["step time"].x) == ["#1", "#2", "#3"] and list(bars["step time"].hovertext) == long
    assert MEASURED_BUBBLE in bars and list(bars[MEASURED_BUBBLE].y) == [0.25, 0.25, None]  # (not 0)
    assert list(bars["predicted (simulator)"].y) == [0.2, 0.2, None]
    (key,) = fig.layout.annotations[-1:]
    assert key.text.split("<br>") == [f"#{k}  {t}" for k, t in enumerate(long, 1)]
    assert fig.layout.legend.y > 1  # (above the panels: under them it covered the runs' names)
    short = runs_figure(rows(["1f1b", "zb_h1"]))
    assert list(short.data[0].x) == ["1f1b", "zb_h1"] and not any("#1" in a.text for a in short.layout.annotations)


def test_compare_png_numbers_long_labels_spells_them_out_and_draws_no_bar_for_a_missing_figure(tmp_path, monkeypatch):
    import math

    import matplotlib.axes
    import matplotlib.figure

    drawn = {"bars": [], "ticks": [], "texts": []}  # (what matplotlib was asked to draw, drawn as asked)
    bar, ticks, text = matplotlib.axes.Axes.bar, matplotlib.axes.Axes.set_xticklabels, matplotlib.figure.Figure.text
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "bar",
        lambda ax, x, h, *a, **k: drawn["bars"].append((k.get("label"), list(h))) or bar(ax, x, h, *a, **k),
    )
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "set_xticklabels",
        lambda ax, t, *a, **k: drawn["ticks"].append(list(t)) or ticks(ax, t, *a, **k),
    )
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "text",
        lambda f, x, y, t, *a, **k: drawn["texts"].append(t) or text(f, x, y, t, *a, **k),
    )
    long = [LONG + d for d in ("fp32", "bf16", "fp16")]
    plot_runs(rows(long[:2]) + rows(long[2:], timers=False), tmp_path / "long.png", "3 runs")
    assert drawn["ticks"] and all(t == ["#1", "#2", "#3"] for t in drawn["ticks"])
    assert "\n".join(f"#{k}  {t}" for k, t in enumerate(long, 1)) in drawn["texts"]
    measured = next(h for name, h in drawn["bars"] if name == MEASURED_BUBBLE)
    assert measured[:2] == [0.25, 0.25] and math.isnan(measured[2])  # (no bar: it drew one of 0)
    drawn["ticks"].clear()
    plot_runs(rows(["a", "b"]), tmp_path / "short.png", "2 runs")
    assert all(t == ["a", "b"] for t in drawn["ticks"])
    assert (tmp_path / "long.png").read_bytes()[:4] == b"\x89PNG"
