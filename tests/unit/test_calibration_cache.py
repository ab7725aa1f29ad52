"""`ppx plan --calibrate`'s cache: where it lives, and which kept calibration a plan takes (the
newest completed one at the plan's p on this host; a failed or unfinished one never)."""

from __future__ import annotations

import json

from ppx.commands import calibration


def _run(root, p, name, status):
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
    old = _run(tmp_path, 2, "20261101-100000", "completed")
    _run(tmp_path, 2, "20261102-100000", "failed")
    _run(tmp_path, 2, "20261103-100000", None)  # still running: no summary yet
    _run(tmp_path, 4, "20261104-100000", "completed")  # another p
    assert calibration.completed(2) == old
    newer = _run(tmp_path, 2, "20261105-100000", "completed")
    assert calibration.completed(2) == newer
    assert calibration.calibrated_run(2, "reuse") == (newer, False)
    assert calibration.measured_at(newer) == "2026-11-05 10:00 UTC"
