"""report.html, built from hand-made summaries and timelines walked out of the simulator (no
processes): self-contained (Plotly's bundle inlined once, no script or stylesheet from the
network), the elements the browser test reads, one bar per compute span of the last step,
one arrow per hand-off of the last step, the config; and the comparison's page."""

from __future__ import annotations

import json
import re

import pytest

from ppx import schedules
from ppx.measure.spans import Span, handoffs
from ppx.report import plotly_figures
from ppx.report.compare import COLUMNS, bubble_series
from ppx.report.html_report import write_compare_html, write_run_html
from ppx.report.split_ways import split_line
from ppx.schedules.comms.program import compile_program

PLOTLY_BANNER = re.compile(r"\* plotly\.js v\d")


def measured_steps(sched, steps=(3, 4), ms: float = 1.0) -> list[dict]:
    """A RunReport-like timeline: each step's program items on each rank, compute timed as the
    simulator times it (``ms`` per unit), posts right after the compute before them, each wait
    up to the start of the compute it feeds, a short drain at the end; steps back to back."""
    tl = schedules.simulate(sched, schedules.Costs(fwd=1.0, bwd=2.0, p2p=0.1, send_post=0.05, recv_post=0.05))
    out, t0 = [], 0.0
    for k in steps:
        ranks = {}
        for r, row in enumerate(sched.actions):
            events, n, t, spans = tl.events[r], 0, 0.0, []  # events[n]: the next compute's
            for it in compile_program(row, sched.stage_to_rank):
                if it.kind == "compute":
                    start = max(events[n].start, t)
                    end, n = start + events[n].end - events[n].start, n + 1
                elif it.kind == "wait":  # up to the start of the compute it feeds
                    start, end = t, max(t, events[n].start)
                else:  # post, drain
                    start, end = t, t + 0.05
                spans.append(Span.of(it, t0 + start * ms * 1e-3, t0 + end * ms * 1e-3))
                t = end
            ranks[r] = spans
        end = max(sp.end_s for spans in ranks.values() for sp in spans)
        out.append({"step": k, "step_time_s": end - t0, "ranks": ranks})
        t0 = end + 1e-4
    return out


def summary_of(sched, timeline=None, name="1f1b") -> dict:
    p = sched.num_ranks
    ranks = [
        {
            "rank": r,
            "compute_s": 0.004,
            "comm_s": 0.001,
            "idle_s": 0.002 + 0.001 * r,
            "peak_activation_bytes": 4096 * (p - r),
            "peak_memory_bytes": 300 * 2**20,
            "peak_inflight_microbatches": p - r,
        }
        for r in range(p)
    ]
    return {
        "status": "completed",
        "experiment": "test",
        "schedule": name,
        "stages": sched.num_stages,
        "microbatches": sched.num_microbatches,
        "world_size": p,
        "device": "cpu",
        "backend": "gloo",
        "steps": 5,
        "batch_size": 16,
        "model": "mlp",
        "virtual_stages": sched.stages_per_rank,
        "losses": [1.0, 0.9, 0.8, 0.7, 0.6],
        "step_time_s": 0.0075,
        "bubble_fraction": 0.31,
        "bubble_fraction_theory": 0.2727,
        "bubble_over_ideal_theory": 0.375,
        "ranks": ranks,
        "throughput_samples_per_s": 2000.0,
    }


CONFIG = "run:\n  name: test\npipeline:\n  schedule: 1f1b\n  microbatches: 8\n"


def offline_problems(page: str) -> list[str]:
    """<script src>, <link href>, @import or url() pointing at the network."""
    bad = re.findall(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//", page, re.I)
    bad += re.findall(r"@import|url\(\s*[\"']?(?:https?:)?//", page, re.I)
    return bad


def div_attrs(page: str, div_id: str) -> dict[str, str]:
    tag = re.search(rf'<div id="{div_id}"([^>]*)>', page)
    assert tag, f"no #{div_id}"
    return dict(re.findall(r'data-([\w-]+)="([^"]*)"', tag.group(1)))


def new_plot(page: str, div_id: str) -> tuple[list[dict], dict]:
    """The traces and layout Plotly.newPlot gets for the div (the JSON in the page)."""
    at = re.search(rf'Plotly\.newPlot\(\s*"{div_id}",\s*', page).end()
    dec = json.JSONDecoder()
    data, end = dec.raw_decode(page, at)
    layout, _ = dec.raw_decode(page, re.compile(r",\s*").match(page, end).end())
    return data, layout


@pytest.mark.parametrize("name,p,m,v", [("1f1b", 4, 8, 1), ("interleaved_1f1b", 2, 4, 2), ("zb_h1", 2, 4, 1)])
def test_run_page_is_self_contained_and_draws_every_mark(tmp_path, name, p, m, v):
    sched = schedules.build(name, p, m, v)
    timeline = measured_steps(sched)
    summary = summary_of(sched, timeline, name)
    median = (4, summary)
    path = write_run_html(tmp_path, summary, timeline, sched.stage_to_rank, CONFIG, median)
    assert path == tmp_path / "report.html"
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and '<body data-page="run">' in page
    assert offline_problems(page) == []
    assert len(PLOTLY_BANNER.findall(page)) == 1  # the bundle inlined, once
    for div in ("summary", "timeline", "breakdown", "memory", "config"):
        assert f'id="{div}"' in page, div
    last = timeline[-1]
    computes = sum(sp.kind == "compute" for spans in last["ranks"].values() for sp in spans)
    arrows = len(list(handoffs(last["ranks"], sched.stage_to_rank)))
    assert computes == sum(not a.op.is_comm for row in sched.actions for a in row)
    assert arrows > 0
    attrs = div_attrs(page, "timeline")
    assert attrs == {
        "ranks": str(p),
        "steps": "2",
        "last-step": "4",
        "last-step-trace": "step 4",
        "last-step-actions": str(computes),
        "arrows": str(arrows),
    }
    data, layout = new_plot(page, "timeline")
    assert all(t["type"] == "bar" for t in data)  # the i-th .barlayer .trace is the i-th trace
    (mine,) = [t for t in data if t["name"] == "step 4"]
    assert len(mine["x"]) == len(mine["base"]) == len(mine["y"]) == computes  # one bar per compute span
    assert {t["name"] for t in data} >= {"step 3", "step 4", "step 4 posts", "step 4 waits"}
    assert set(mine["y"]) == {f"rank {r}" for r in range(p)}
    hover = mine["hovertemplate"]
    assert all(w in hover for w in ("microbatch", "stage", "start", "length"))
    assert len(layout["annotations"]) == arrows and all(a["showarrow"] for a in layout["annotations"])
    assert layout["yaxis"]["categoryarray"] == [f"rank {r}" for r in range(p)]
    assert layout["yaxis"]["autorange"] == "reversed"  # rank 0 at the top
    assert "schedule: 1f1b" in page.split('<pre id="config">')[1].split("</pre>")[0]
    assert "27.3%" in page and "31.0%" in page  # theory and measured bubble in the summary table


def test_run_page_without_timers_shows_what_exists(tmp_path):
    sched = schedules.build("1f1b", 2, 4)
    summary = summary_of(sched)
    summary["ranks"] = [{"rank": r} for r in range(2)]
    summary.pop("bubble_fraction")
    summary.update(steps=1, dtype="bf16", data_parallel=2)
    page = write_run_html(tmp_path, summary, [], sched.stage_to_rank, CONFIG, None).read_text()
    assert offline_problems(page) == [] and 'id="config"' in page and 'id="summary"' in page
    assert " 1 step of batch " in page  # (it said "1 steps")
    assert "<title>ppx run: " in page and "replicas" not in page.split("</title>")[0]  # (the line under it says so)
    for div in ("timeline", "breakdown", "memory"):
        assert f'<div id="{div}"' not in page
    assert page.count('class="missing"') == 3
    assert len(PLOTLY_BANNER.findall(page)) == 0  # no figure, no bundle


SPLIT = {  # summary.json's split_backward, as ppx run writes it under auto
    "0": {"mode": "whole", "why": "each I followed at once by its W: one backward, in the I"},
    "1": {
        "mode": "store",
        "stored_layers": 29,
        "small_params": 9,
        "graph_bytes": 3 * 2**20,
        "store_bytes": 2 * 2**20 + 2**19,
        "why": "the stores hold no more than the graph",
    },
}


def test_a_split_backward_gets_a_table_and_a_line_per_stage(tmp_path):
    sched = schedules.build("zb_h1", 2, 4)
    summary = {**summary_of(sched, name="zb_h1"), "split_backward": SPLIT, "input_freed_share": [1.0, 0.1667]}
    page = write_run_html(tmp_path, summary, [], sched.stage_to_rank, CONFIG, None).read_text()
    table = page.split('<div class="wide"><table id="split">')[1].split("</table>")[0]  # (scrolls when narrow)
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in table.split("<tr>")[2:]]
    assert rows == [
        ["0", "whole", "", "", "100%", SPLIT["0"]["why"]],
        ["1", "store", "29", "stores 2.50 MiB, the graph 3.00 MiB", "17%", SPLIT["1"]["why"]],
    ]
    assert split_line(summary) == (
        "ppx: split backward: stage 0 whole (each I followed at once by its W: one backward, in the I), "
        "stage 1 store (29 layers' inputs and output gradients from I to W: 2.50 MiB a microbatch against "
        "the graph's 3.00 MiB)"
    )
    graph = {"0": {"mode": "graph", "why": "train.split_backward=graph"}}
    assert split_line({"split_backward": graph}) == "ppx: split backward: stage 0 graph (train.split_backward=graph)"
    # a run that split nothing: neither
    (tmp_path / "1f1b").mkdir()
    plain = write_run_html(tmp_path / "1f1b", summary_of(schedules.build("1f1b", 2, 4)), [], (0, 1), CONFIG, None)
    assert 'id="split"' not in plain.read_text() and split_line({}) is None


def test_arrows_run_from_the_post_to_the_end_of_the_wait():
    sched = schedules.build("1f1b", 2, 2)
    timeline = measured_steps(sched, steps=(0,))
    fig, facts = plotly_figures.timeline_figure(timeline, sched.stage_to_rank)
    got = sorted((a.ax, a.ay, a.x, a.y) for a in fig.layout.annotations)
    origin = min(sp.start_s for spans in timeline[0]["ranks"].values() for sp in spans)
    want = sorted(
        ((h.posted_s - origin) * 1e3, h.rank, (h.wait_end_s - origin) * 1e3, h.peer)
        for h in handoffs(timeline[0]["ranks"], sched.stage_to_rank)
    )
    assert facts["arrows"] == len(got) == len(want) == 4  # 2 F sends, 2 B sends
    assert [x for a in got for x in a] == pytest.approx([x for a in want for x in a])
    assert fig.layout.showlegend is False  # (the page's key names the colours; "step K" showed one blue)


def test_a_forward_only_runs_activations_panel_reads_from_0():
    ranks = [{"rank": r, "peak_activation_bytes": 0, "peak_memory_bytes": 3 * 2**20} for r in range(2)]
    fig = plotly_figures.memory_figure(ranks)
    assert list(fig.layout.yaxis.range) == [0, 1] and fig.layout.yaxis2.range is None  # (Plotly's own ran -1 to 1)


def test_compare_page_has_the_runs_and_the_bubble_against_m(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.html").write_text("<html></html>")
    rows = [
        {
            "name": f"run{m}{s}",
            "path": str(tmp_path / ("a" if m == 2 else "b")),
            "label": f"{s} m={m}",
            "schedule": s,
            "world_size": 2,
            "microbatches": m,
            "v": 1,
            "model": "mlp",
            "step_ms": 10.0 / m,
            "throughput": 100.0 * m,
            "bubble": 0.5 / m,
            "predicted": 0.45 / m,
            "theory": 1 / (m + 1),
            "predicted_error_pt": 5 / m,
            "peak_act_kib": 4.0,
            "peak_mem_mib": 300.0,
            "final_loss": 0.5,
        }
        for s in ("gpipe", "1f1b")
        for m in (2, 4, 8)
    ]
    series = bubble_series(rows)
    path = write_compare_html(tmp_path, rows, COLUMNS, "6 runs", series)
    page = path.read_text()
    assert '<body data-page="compare">' in page and offline_problems(page) == []
    assert len(PLOTLY_BANNER.findall(page)) == 1
    assert 'id="runs-table" data-runs="6"' in page and page.count("<tr>") == 7
    assert page.count('href="a/report.html"') == 2  # the runs that have a page link to it
    assert 'id="runs"' in page and 'id="bubble"' in page
    traces = new_plot(page, "bubble")[0]
    names = [t["name"] for t in traces]
    kinds = (" theory", "", " predicted", " the run's theory")
    assert names == [f"{s} (p=2){w}" for s in ("1f1b", "gpipe") for w in kinds]
    # each run's own theory (the table's column) beside the closed form, which may differ
    rings = next(t for t in traces if t["name"] == "1f1b (p=2) the run's theory")
    assert list(zip(rings["x"], rings["y"])) == [(m, 1 / (m + 1)) for m in (2, 4, 8)]
    no_m = write_compare_html(tmp_path, rows[:1], COLUMNS, "1 run", bubble_series(rows[:1])).read_text()
    assert '<div id="bubble"' not in no_m and 'class="missing"' in no_m
