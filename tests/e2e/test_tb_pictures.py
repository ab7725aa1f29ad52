"""What TensorBoard shows offline, read back from the event files: a run's timeline and
breakdown pictures and its text summary (theory against measured, the config), and `ppx
compare`'s pictures and table in the comparison's tb/."""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from helpers import PICTURED_1F1B, ppx, read_json


def events(tb) -> EventAccumulator:
    acc = EventAccumulator(str(tb), size_guidance={"images": 0, "tensors": 0, "scalars": 0})
    acc.Reload()
    return acc


@pytest.fixture(scope="module")
def run(shared_run):
    return shared_run(*PICTURED_1F1B).dir  # read only: shared with other files


def test_run_logs_pictures_and_a_text_summary(run):
    assert (run / "breakdown.png").read_bytes()[:4] == b"\x89PNG"
    acc = events(run / "tb")
    tags = acc.Tags()
    assert {"timeline", "breakdown"} <= set(tags["images"])
    for tag in ("timeline", "breakdown"):
        (image,) = acc.Images(tag)
        assert image.step == 2 and image.width > 600 and image.height > 200, tag
        assert image.encoded_image_string[:4] == b"\x89PNG"
    assert "loss" in tags["scalars"] and "bubble/theory" in tags["scalars"]  # the scalars stay
    (text,) = acc.Tensors("summary/text_summary")
    summary = text.tensor_proto.string_val[0].decode()
    assert "theory vs measured" in summary and "bubble, idle / busy time" in summary
    assert "```yaml" in summary and "schedule: 1f1b" in summary and "microbatches: 4" in summary
    s = read_json(run / "summary.json")
    assert f"{s['bubble_fraction_theory']:.1%}" in summary  # 20.0%


def test_compare_logs_its_pictures_and_table(run, tmp_path):
    out = tmp_path / "cmp"
    c = ppx("compare", str(run), "--out", str(out))
    assert c.returncode == 0, c.stderr
    acc = events(out / "tb")
    (image,) = acc.Images("compare")
    assert image.width > 600 and image.height > 300
    (text,) = acc.Tensors("compare/text_summary")
    assert b"1f1b" in text.tensor_proto.string_val[0]
