"""The per-rank breakdown picture from a hand-written summary, the TensorBoard text summary
(theory against measured, then the config), and a comparison folder logged to TensorBoard."""

from __future__ import annotations

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ppx.report.breakdown import draw_breakdown, has_breakdown, title_of
from ppx.report.tensorboard import log_comparison, summary_markdown


def summary(theory=0.2, memory=True) -> dict:
    ranks = []
    for r in range(4):
        row = {"rank": r, "compute_s": 0.010, "comm_s": 0.002, "idle_s": 0.003 * r}
        if memory:
            row["peak_activation_bytes"] = (4 - r) * 3 * 2**20
        ranks.append(row)
    return {
        "experiment": "hand",
        "schedule": "1f1b",
        "stages": 4,
        "microbatches": 8,
        "virtual_stages": 1,
        "world_size": 4,
        "steps": 3,
        "losses": [1.0, 0.9, 0.8],
        "step_time_s": 0.021,
        "bubble_fraction": 0.21,
        "bubble_over_ideal": 0.21 / 0.79,
        "bubble_fraction_theory": theory,
        "bubble_over_ideal_theory": None if theory is None else theory / (1 - theory),
        "ideal_step_time_s": None,
        "throughput_samples_per_s": 1500.0,
        "ranks": ranks,
    }


def test_breakdown_picture_from_a_hand_written_summary(tmp_path):
    s = summary()
    assert has_breakdown(s) and title_of(s) == "hand: 1f1b, p=4, m=8"
    draw_breakdown(s, tmp_path / "breakdown.png")
    data = (tmp_path / "breakdown.png").read_bytes()
    assert data[:4] == b"\x89PNG" and len(data) > 10_000
    draw_breakdown(summary(theory=None, memory=False), tmp_path / "plain.png")  # no theory, no memory panel
    assert (tmp_path / "plain.png").stat().st_size > 5_000


def test_no_breakdown_without_timers():
    s = summary()
    s["ranks"] = [{"rank": r["rank"]} for r in s["ranks"]]
    assert not has_breakdown(s) and not has_breakdown({"ranks": []})


def test_text_summary_holds_theory_against_measured_and_the_config():
    text = summary_markdown(summary(), "pipeline:\n  schedule: 1f1b\n")
    assert "### theory vs measured" in text
    assert "| bubble, idle / step time | 21.0% |  | 20.0% |" in text
    assert "| bubble, idle / busy time | 26.6% |  | 25.0% |" in text
    assert "| step time (median) | 21.000 ms |  |  |" in text
    assert "| final loss | 0.800000 |  |  |" in text
    assert text.endswith("```yaml\npipeline:\n  schedule: 1f1b\n```\n")


def test_a_predicted_bubble_sits_beside_the_bubble_of_the_steps_it_was_predicted_for():
    """The prediction comes from the timeline steps' costs: beside their bubble, not the median
    over all steps (which the theory stands beside)."""
    s = {**summary(), "measured_bubble_fraction": 0.25, "predicted": {"bubble_fraction": 0.24, "step_time_s": 0.02}}
    text = summary_markdown(s)
    assert "| bubble, idle / step time | 21.0% |  | 20.0% |" in text
    assert "| bubble, idle / step time (timeline steps, mean) | 25.0% | 24.0% |  |" in text
    s["predicted"] = {**s["predicted"], "stalled_steps_left_out": [3, 7]}  # (left out of the prediction's steps)
    assert "| bubble, idle / step time (timeline steps but 2 stalled, mean) | 25.0% |" in summary_markdown(s, "")
    assert "| bubble, idle / busy time (timeline steps, of the mean) | 33.3% | 31.6% |  |" in text


def test_text_summary_of_a_split_backward_has_its_table():
    split = {"0": {"mode": "whole", "why": "every I is followed at once by its W"}}
    text = summary_markdown({**summary(), "split_backward": split, "input_freed_share": [1.0]})
    assert "### split backward by stage\n\n| stage | way |" in text
    assert "| 0 | whole |  |  | 100% | every I is followed at once by its W |" in text
    assert "### split backward" not in summary_markdown(summary())


def test_a_comparison_folder_is_logged_as_images_and_text(tmp_path):
    assert log_comparison(tmp_path) is None  # nothing to log
    draw_breakdown(summary(), tmp_path / "compare.png")  # any picture will do
    (tmp_path / "compare.md").write_text("| run | bubble |\n| --- | --- |\n| a | 10% |\n")
    assert log_comparison(tmp_path) == tmp_path / "tb"
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    assert acc.Tags()["images"] == ["compare"]  # no bubble.png here
    (image,) = acc.Images("compare")
    assert image.width > 500 and image.height > 300
    (text,) = acc.Tensors("compare/text_summary")
    assert b"| a | 10% |" in text.tensor_proto.string_val[0]


def test_headers_name_replicas_dtype_and_recompute():
    from ppx.report.summary_table import setup_words

    plain = summary()
    assert setup_words(plain) == "" and setup_words({**plain, "dtype": "fp32", "recompute": "none"}) == ""
    mixed = {**plain, "data_parallel": 2, "processes": 8, "dtype": "bf16", "recompute": "selective"}
    assert setup_words(mixed) == ", 2 replicas (8 processes), bf16, recompute selective"
    assert "ranks on None (None), 2 replicas (8 processes), bf16, recompute selective, 3 steps" in summary_markdown(
        mixed
    )


def test_a_title_names_a_compute_dtype_and_replicas_and_a_forward_only_panel_reads_0_to_1(tmp_path, monkeypatch):
    """The bf16 and the two-replica pictures of one 1F1B config had one title; a forward-only
    run's activations panel (every rank 0 B) ran from 0 to 1.2e-9 B."""
    s = summary() | {"dtype": "bf16", "data_parallel": 2}
    assert title_of(s) == "hand: 1f1b, p=4, m=8, bf16, 2 replicas (replica 0's ranks)"
    assert title_of(summary() | {"dtype": "fp32", "data_parallel": 1}) == "hand: 1f1b, p=4, m=8"
    import matplotlib.axes

    limits, set_ylim = [], matplotlib.axes.Axes.set_ylim  # (each axis's limits, as drawn)
    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylim", lambda ax, *a, **k: limits.append(a) or set_ylim(ax, *a, **k))
    s = summary()
    for r in s["ranks"]:
        r["peak_activation_bytes"] = 0
    draw_breakdown(s, tmp_path / "forward_only.png")
    assert (0, 1) in limits, limits
    assert "1 step of batch" in summary_markdown(summary() | {"steps": 1, "batch_size": 8}, "")
