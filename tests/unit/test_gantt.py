"""The Gantt picture's legend names what the picture shows: I and W for split backwards, the
later-stage shade for interleaved ranks, and no communication entries for a simulated
(compute-only) timeline."""

from ppx import schedules
from ppx.measure.spans import Span
from ppx.report.gantt import draw_step, legend_entries, stage_shades
from ppx.schedules.ir.action import Action


def simulated_spans(name: str, p: int, m: int, **kw) -> tuple[dict, tuple]:
    sched = schedules.build(name, p, m, **kw)
    t = schedules.simulate(sched, schedules.Costs())
    spans = {
        r: [Span("compute", str(e.action), (e.action,), e.start, e.end) for e in row] for r, row in enumerate(t.events)
    }
    return spans, sched.stage_to_rank


def names(entries) -> list[str]:
    return [n for _, n, _ in entries]


def test_legend_names_split_backwards_and_no_comm_for_a_simulated_timeline(tmp_path):
    spans, s2r = simulated_spans("zb_h1", 4, 8)
    assert names(legend_entries(spans, False, False)) == [
        "forward",
        "input-grad backward (I)",
        "weight-grad backward (W)",
        "idle",
    ]
    spans, _ = simulated_spans("1f1b", 2, 4)
    assert names(legend_entries(spans, False, False)) == ["forward", "backward", "idle"]
    draw_step(spans, tmp_path / "g.png", "1f1b", (0, 1))
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    # a simulated step's white is its communication and idle (the simulator keeps no comm spans)
    gaps = "not computing: communication or idle"
    assert names(legend_entries(spans, False, False, gaps))[-1] == gaps
    draw_step(spans, tmp_path / "n.png", "1f1b", (0, 1), gaps=gaps, rank_notes={0: "comm 1.00, idle 2.00 ms"})
    assert (tmp_path / "n.png").read_bytes()[:4] == b"\x89PNG"


def test_a_legend_of_eight_entries_fits_the_picture(tmp_path):
    # ZB-V's eight entries in one row ran past both edges of a 12-inch picture: four a row
    import matplotlib.image

    spans, s2r = simulated_spans("zbv", 4, 8)
    spans[0].append(Span("post", "0SEND_F0", (Action.parse("0SEND_F0"),), 0.0, 0.1))
    spans[1].append(Span("wait", "1RECV_F0", (Action.parse("1RECV_F0"),), 0.05, 0.2))  # (a transfer drawn)
    assert len(legend_entries(spans, True, True)) == 8
    draw_step(spans, tmp_path / "z.png", "zbv", s2r)
    pixels = matplotlib.image.imread(tmp_path / "z.png")[..., :3]
    edges = pixels[:, :3], pixels[:, -3:]  # (a legend wider than the picture was cut there)
    assert all((edge > 0.99).all() for edge in edges), "something drawn at the picture's edge: cut off"
    assert pixels.shape[1] <= 12 * 120 + 40, pixels.shape


def test_legend_marks_later_stages_and_the_communication_drawn(tmp_path):
    spans, s2r = simulated_spans("interleaved_1f1b", 2, 4, virtual_stages=2)
    assert s2r == (0, 1, 0, 1)
    spans[0].append(Span("post", "0SEND_F0", (Action.parse("0SEND_F0"),), 0.0, 0.1))
    spans[1].append(Span("drain", "wait sends", (), 9.0, 9.1))
    got = legend_entries(spans, True, True)
    assert names(got) == [
        "forward",
        "backward",
        "lighter: a rank's later stage (cells read stage, op, microbatch)",
        "send/recv posted",
        "waiting on a peer",
        "transfer (peer had sent)",
        "idle",
    ]
    alphas = [a for k, _, a in got if k == "F"]
    assert alphas[0] == 1.0 and len(alphas) == 2 and 0 < alphas[1] < 1  # the later stage drawn lighter
    draw_step(spans, tmp_path / "g.png", "interleaved", s2r)
    assert (tmp_path / "g.png").stat().st_size > 1000


def test_four_stages_per_rank_are_drawn_in_four_shades(tmp_path):
    # a rank's later stages are lighter; with four of them the last one stays visible
    # (0.35 less per stage once drew the fourth at a negative alpha, and the report failed)
    spans, s2r = simulated_spans("interleaved_1f1b", 2, 4, virtual_stages=4)
    shades = stage_shades(s2r)
    assert [shades[s] for s in (0, 2, 4, 6)] == sorted((shades[s] for s in (0, 2, 4, 6)), reverse=True)
    assert shades[0] == 1.0 and min(shades.values()) > 0.3 and len(set(shades.values())) == 4
    assert stage_shades((0, 1, 0, 1))[2] == 0.65
    draw_step(spans, tmp_path / "g.png", "interleaved v=4", s2r)
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
