"""Files written whole or not at all (`ppx.files`): the file before stays where the write
fails, no part is left, a link stays a link, and what is not a file is written in place."""

from __future__ import annotations

import json
import os

import pytest

from ppx.files import write_json, write_whole


def test_a_link_stays_a_link_to_the_file_written(tmp_path):
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("{}")
    link.symlink_to(target)
    write_json(link, {"a": 1})
    assert link.is_symlink() and json.loads(target.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "target.json"]


def test_a_write_that_fails_keeps_the_file_before_and_names_its_path(tmp_path):
    out = tmp_path / "summary.json"
    out.write_text("before")
    (tmp_path / "summary.json.tmp").mkdir()  # (the part's place taken: its write fails)
    with pytest.raises(IsADirectoryError) as e:
        write_whole(out, "after")
    assert e.value.filename == str(out) and out.read_text() == "before"


def test_a_pipe_is_written_in_place(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        write_whole(fifo, "through the pipe\n")
        assert os.read(reader, 100) == b"through the pipe\n"
    finally:
        os.close(reader)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]
