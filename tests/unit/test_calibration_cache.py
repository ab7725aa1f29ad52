"""`ppx plan --calibrate`'s cache: where it lives, and which kept calibration a plan takes (the
newest completed one at the plan's p on this host; a failed or unfinished one never)."""

from __future__ import annotations

import json

import pytest

from ppx.cli import main
from ppx.commands import calibration

PLAN = ["plan", "--fwd-ms", "10", "--bwd-ms", "10", "-p", "2", "-m", "4", "--schedules", "1f1b", "--jobs", "1"]


def _run(p, name, status):
    d = calibration.folder(p) / name
    d.mkdir(parents=True)
    if status is not None:
        (d / "summary.json").write_text(json.dumps({"status": status}))
    return d


def test_the_cache_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("PPX_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert calibration.cache_root() == tmp_path / "xdg" / "ppx"
    monkeypatch.setenv("PPX_CACHE_DIR", str(tmp_path / "mine"))
    assert calibration.cache_root() == tmp_path / "mine"
    assert calibration.folder(4).parent.parent == tmp_path / "mine" / "calibration"
    assert calibration.folder(4).name == "p4"


def test_the_newest_completed_calibration_at_that_p_is_taken(tmp_path, monkeypatch):
    monkeypatch.setenv("PPX_CACHE_DIR", str(tmp_path))
    assert calibration.completed(2) is None
    old = _run(2, "20261101-100000", "completed")
    _run(2, "20261102-100000", "failed")
    _run(2, "20261103-100000", None)  # still running: no summary yet
    _run(4, "20261104-100000", "completed")  # another p
    assert calibration.completed(2) == old
    newer = _run(2, "20261105-100000", "completed")
    assert calibration.completed(2) == newer
    assert calibration.calibrated_run(2, "reuse") == (newer, False)
    assert calibration.measured_at(newer) == "2026-11-05 10:00 UTC"


def test_a_kept_calibration_that_cannot_be_read_is_passed_over_with_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PPX_CACHE_DIR", str(tmp_path / "cache"))
    broken = _run(2, "20261101-100000", "completed")  # no config.yaml, no measured costs
    assert main([*PLAN, "--out", str(tmp_path / "plan")]) == 0
    out = capsys.readouterr().out
    assert f"note: the kept calibration {broken} cannot be read (" in out
    assert "note: assumed 0 ms of runtime overhead per action and 0 ms per hand-off (flags)" in out
    # asked for by name, the same run is an error of one line, before anything is written
    assert main([*PLAN, "--calibrate", "--out", str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ppx: error: --calibrate: {broken} cannot be read (") and "\n" not in err, err
    assert err.endswith("measure again: --calibrate new")


@pytest.mark.parametrize("p,hint", [(2, "plan again with --calibrate"), (16, "--machine-from <a run directory of 16")])
def test_the_hint_offers_a_calibration_only_where_one_can_run(tmp_path, monkeypatch, capsys, p, hint):
    monkeypatch.setenv("PPX_CACHE_DIR", str(tmp_path / "empty"))
    costs = ["--per-layer", "--fwd-ms", ",".join(["1"] * 16), "--bwd-ms", "1", "--stages", f"2,{p}"]
    assert main(["plan", *costs, "--schedules", "1f1b", "-m", "32", "--jobs", "1", "--out", str(tmp_path / "p")]) == 0
    note = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("note: assumed"))
    assert hint in note, note
    if p == 2:  # the largest p searched is the one calibrated
        assert "pipeline.stages=2 " in note
