"""A real browser, the network blocked (helpers/browser.py), on one real run: its report.html
opened from disk (one timeline row per rank, one bar per compute action of the last step, as
the schedule has them), and TensorBoard's scalars, images and text for it, served by a real
TensorBoard on 127.0.0.1, drawn by headless Chromium."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest

from helpers import PICTURED_1F1B, free_port, read_json
from helpers.browser import blocked_page, chromium
from ppx.config import from_yaml, resolve_schedule

STEPS = 3  # PICTURED_1F1B's train.steps


@pytest.fixture(scope="module")
def run(shared_run):
    """Read only: the run other files read too (helpers.SharedRun); screenshots go to `shots`."""
    return shared_run(*PICTURED_1F1B).dir


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Where the pages' screenshots go, to look at after a failure."""
    return tmp_path_factory.mktemp("browser")


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


def poll(fn, what: str, ok=bool, timeout_s: float = 60):
    """fn() until ok(its value); fails naming what did not happen and the last value seen."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if ok(last):
                return last
        except Exception as e:  # a server not up yet, an element not there yet
            last = e
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout_s} s (last seen: {last!r})")


@pytest.fixture(scope="module")
def tensorboard(run):
    """A TensorBoard on 127.0.0.1 over the run folder (its one TensorBoard run: "tb"), up and
    holding the run's scalars; yields its origin."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(run), "--port", str(port)]
        + ["--host", "127.0.0.1", "--load_fast=false"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    origin = f"http://127.0.0.1:{port}"
    try:

        def has_loss():
            with urllib.request.urlopen(f"{origin}/data/plugin/scalars/tags", timeout=5) as resp:
                return b'"loss"' in resp.read()

        poll(has_loss, "TensorBoard serving the run's scalars")
        yield origin
    finally:
        server.terminate()
        server.wait(timeout=30)


def card_state(page, selector: str, tag: str, script: str):
    """script(element) for the first ``selector`` element whose ``tag`` property is ``tag``
    (TensorBoard's Polymer cards keep it as a property, not an attribute), or None."""
    for el in page.locator(selector).all():
        if el.evaluate("e => e.tag") == tag:
            return el.evaluate(script)
    return None


# the loss card's line chart: is it still loading (its spinner shown), is the chart shown, and
# how many points has each drawn line (Plottable's svg paths "M x,y L x,y ...")
LOSS_CHART = """card => {
  const loader = card.shadowRoot.querySelector('tf-line-chart-data-loader');
  const chart = loader.shadowRoot.querySelector('vz-line-chart2');
  const lines = Array.from(chart.shadowRoot.querySelectorAll('svg path.line'));
  const spinner = loader.shadowRoot.querySelector('#loading-spinner-container');
  return {loading: loader.dataLoading, spinner: !!spinner && spinner.checkVisibility(), shown: chart.checkVisibility(),
          points: lines.map(p => ((p.getAttribute('d') || '').match(/[ML]/g) || []).length)};
}"""

IMAGE = """loader => {
  const img = loader.shadowRoot.querySelector('img');
  return img && img.complete ? {width: img.naturalWidth, height: img.naturalHeight, src: img.src} : null;
}"""


def test_tensorboard_draws_the_runs_scalars_images_and_text_offline(browser, tensorboard, run, shots):
    with blocked_page(browser, allow=(tensorboard,)) as (page, traffic):
        # scalars: the loss card (filtered to it) has loaded and drawn a line through every step
        page.goto(f"{tensorboard}/#scalars&tagFilter=%5Eloss%24")
        chart = poll(
            lambda: card_state(page, "tf-scalar-card", "loss", LOSS_CHART),
            "the loss card drawing its line",
            ok=lambda s: s and not s["loading"] and not s["spinner"] and s["shown"] and STEPS in s["points"],
        )
        assert max(chart["points"]) == STEPS, chart  # one point a step, no more
        page.screenshot(path=shots / "browser-scalars.png")

        # images: the timeline and breakdown pictures loaded (decoded, not a broken image)
        page.goto(f"{tensorboard}/#images")
        for tag, min_width in (("timeline", 600), ("breakdown", 600)):
            img = poll(lambda t=tag: card_state(page, "tf-image-loader", t, IMAGE), f"the {tag} image")
            assert img["width"] > min_width and img["height"] > 200, (tag, img)
            assert img["src"].startswith(f"{tensorboard}/data/plugin/images/"), img

        # text: the summary rendered as markdown (a heading and the theory-vs-measured table)
        page.goto(f"{tensorboard}/#text")
        summary = page.locator("tf-text-loader")
        poll(lambda: summary.get_by_text("theory vs measured").count(), "the text summary")
        assert summary.locator("table").count() >= 1
        bubble = f"{read_json(run / 'summary.json')['bubble_fraction_theory']:.1%}"
        assert summary.get_by_text(bubble, exact=True).count() >= 1, bubble

        # the page drew with the network off; whatever it reached for outside is only recorded
        assert not traffic.page_errors, traffic
        outside = [e for e in traffic.console_errors if "Failed to load resource" not in e]
        assert not outside, traffic


# the rendered timeline, read off the SVG Plotly drew: the y axis's tick labels and, for each
# bar trace (named through the data d3 bound to its <g>), its drawn bars' centres and widths
TIMELINE = """gd => {
  const centre = el => { const r = el.getBoundingClientRect(); return {x: r.x + r.width / 2, y: r.y + r.height / 2, w: r.width}; };
  const ticks = Array.from(gd.querySelectorAll('.ytick text')).map(t => ({text: t.textContent, ...centre(t)}));
  const traces = Array.from(gd.querySelectorAll('.barlayer .trace')).map(t => ({
    name: t.__data__ && t.__data__[0] && t.__data__[0].trace ? t.__data__[0].trace.name : null,
    bars: Array.from(t.querySelectorAll('.point path')).filter(p => (p.getAttribute('d') || 'M0,0Z') !== 'M0,0Z').map(centre),
  }));
  return {ticks, traces};
}"""


def test_report_html_shows_a_row_per_rank_and_a_bar_per_action_offline(browser, run, shots):
    sched = resolve_schedule(from_yaml(run / "config.yaml"))
    p, last = sched.num_ranks, f"step {STEPS - 1}"
    want = {f"rank {r}": sum(a.op.is_compute for a in row) for r, row in enumerate(sched.actions)}
    names = {f"rank {r}": {str(a) for a in row if a.op.is_compute} for r, row in enumerate(sched.actions)}
    with blocked_page(browser) as (page, traffic):
        page.goto((run / "report.html").as_uri())
        timeline = page.locator("#timeline")
        drawn = poll(
            lambda: timeline.evaluate(TIMELINE),
            "Plotly drawing the timeline",
            ok=lambda t: len(t["ticks"]) == p and any(tr["name"] == last and tr["bars"] for tr in t["traces"]),
            timeout_s=30,
        )
        page.screenshot(path=shots / "browser-report.png", full_page=True)
        # one row per rank
        assert sorted(t["text"] for t in drawn["ticks"]) == sorted(want), drawn["ticks"]
        # the last step's trace: one bar per compute action, each on its rank's row
        (bars,) = [tr["bars"] for tr in drawn["traces"] if tr["name"] == last]
        row_of = lambda bar: min(drawn["ticks"], key=lambda t: abs(t["y"] - bar["y"]))["text"]  # noqa: E731
        got = {row: sum(row_of(b) == row for b in bars) for row in want}
        assert got == want, f"bars of {last} per row: {got}, the schedule's compute actions: {want}"
        # hovering the widest of them names its action, the step and the row
        bar = max(bars, key=lambda b: b["w"])
        page.mouse.move(bar["x"], bar["y"])
        label = poll(lambda: page.locator("#timeline .hoverlayer .hovertext").first.text_content(), "a hover label")
        row = row_of(bar)
        action, _, where = label.partition(" (")  # "1F0 (step 3, rank 1)microbatch 0, ..."
        assert action in names[row] and where.startswith(f"{last}, {row})"), (label, names[row])
        # the other figures drew too, and config.yaml is on the page
        for fig in ("breakdown", "memory"):
            assert page.locator(f"#{fig} .main-svg").count() >= 1, fig
        assert "schedule: 1f1b" in page.locator("#config").text_content()
        # from disk with the network off, and it asked for nothing outside
        assert not (traffic.blocked or traffic.failed or traffic.console_errors or traffic.page_errors), traffic


def test_the_blocked_page_reaches_nothing_outside(browser, tmp_path):
    """The blocking itself: a file:// page asking for an outside image, an outside fetch and a
    loopback port it was not allowed gets none of them, and each attempt is recorded."""
    port = free_port()
    page_file = tmp_path / "outside.html"
    page_file.write_text(
        '<img src="https://example.com/a.png"><script>'
        f"Promise.allSettled([fetch('http://203.0.113.7/x'), fetch('http://127.0.0.1:{port}/y')])"
        ".then(r => document.title = r.map(x => x.status).join(' '));</script>"
    )
    with blocked_page(browser) as (page, traffic):
        page.goto(page_file.as_uri())
        poll(lambda: page.title(), "the page's fetches settling")
        assert page.title() == "rejected rejected"
        poll(lambda: len(traffic.blocked) == 3, f"three blocked requests ({traffic})", timeout_s=10)
        assert set(traffic.blocked) == {
            "https://example.com/a.png",
            "http://203.0.113.7/x",
            f"http://127.0.0.1:{port}/y",
        }
        assert len(traffic.failed) == 3, traffic
