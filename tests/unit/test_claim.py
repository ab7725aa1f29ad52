"""Run directories claimed by the launcher (ppx.launch.claim)."""

from ppx import config
from ppx.launch.claim import claim


def test_run_directories_claimed_in_one_second_are_distinct(tmp_path):

    cfg = config.load("gpipe_2cpu", [f"run.root={tmp_path}"])
    first, second, third = claim(cfg), claim(cfg), claim(cfg)  # within a second, mostly: same stamp
    assert len({first, second, third}) == 3 and all(p.is_dir() for p in (first, second, third))
    stamp = first.name
    if second.name.startswith(stamp):
        assert second.name == f"{stamp}-1"
