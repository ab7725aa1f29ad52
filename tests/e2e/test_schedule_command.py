"""`ppx schedule`: a schedule exported to CSV reads back as built."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import REPO, ppx
from ppx import schedules


def test_exported_interleaved_csv_runs_as_built(tmp_path):
    """Interleaved batches sends with computes (groups); its CSV keeps the comms so that
    reading it back gives the same, deadlock-free list."""
    path = tmp_path / "il.csv"
    r = ppx("schedule", "interleaved_1f1b", "-p", "3", "-m", "6", "--csv", str(path))
    assert r.returncode == 0 and "with its SEND/RECV actions" in r.stdout, r.stderr
    assert schedules.from_csv(path).actions == schedules.build("interleaved_1f1b", 3, 6, 2).actions


def test_a_csv_named_as_a_family_is_given_no_formula(tmp_path):
    """A 1F1B order saved as zb_h1.csv (an exported list, edited): its own bubble only, in
    ppx schedule and ppx simulate, not ZB-H1's closed form (the file's stem is no family)."""
    path = tmp_path / "zb_h1.csv"
    schedules.write_csv(schedules.build("1f1b", 2, 4).compute_only(), path)
    r = ppx("schedule", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == (
        "bubble (idle share of the step): simulated 20.0% (a CSV order: no theory; this is its own bubble)"
    )
    r = ppx("simulate", str(path))
    assert r.returncode == 0 and "theory" not in r.stdout, r.stdout
    r = ppx("simulate", "zb_h1", "-p", "2", "-m", "4", "--wgrad-ms", "10", "--bwd-ms", "10")  # (the family has it)
    assert "theory ((p-1)/(3m+p-1)" in r.stdout, r.stdout


def test_a_csv_with_torchs_own_comms_prints_the_orders_own_bubble_too(tmp_path):
    """torch's LoopedBFS with its own sends and receives runs as written, but its early
    receives hold ranks back on NCCL; ppx prints that and the order's own bubble."""
    from helpers.torch_orders import torch_csv_with_comms

    path = tmp_path / "bfs.csv"
    torch_csv_with_comms("ScheduleLoopedBFS", 4, 8, 2, path)
    r = ppx("schedule", str(path))
    assert r.returncode == 0, r.stderr
    *_, line, note = r.stdout.strip().splitlines()
    assert line.startswith("bubble (idle share of the step): simulated ")
    # (torch's LoopedBFS runs each stage's backwards from the last microbatch to the first)
    assert note.startswith(f"note: {path} adds stage 4's weight gradients of microbatch 5 after microbatch 7's: ")
    assert "with the CSV's own sends and receives on nccl; 15.8% with ppx's placement of the same compute order" in line
    # written over itself without its sends and receives: the bubble line reads the order it was given
    again = ppx("schedule", str(path), "--csv", str(path))
    assert again.returncode == 0 and f"{line}\n" in again.stdout, again.stdout + again.stderr


def test_torchs_deferred_receives_for_zbv_are_refused_with_the_way_out(tmp_path):
    """torch's defer_pp_recv lowering posts ZB-V's receives out of channel order for NCCL: ppx
    says so and how to run the order anyway."""
    from helpers.torch_orders import torch_csv_with_comms

    path = tmp_path / "zbv.csv"
    torch_csv_with_comms("ScheduleZBVZeroBubble", 4, 8, 2, path, defer_pp_recv=True)
    r = ppx("schedule", str(path))
    assert r.returncode != 0
    err = r.stderr.strip()
    assert err.startswith(f"ppx: error: schedule CSV {path}: rank 0 cell ") and "are in a different order" in err, err
    assert err.endswith("drop its SEND/RECV cells and ppx places its own, which run)"), err
    assert len(err.splitlines()) == 1


def test_a_split_backwards_grid_shows_its_ws_by_default():
    """Without --wgrad a schedule with W actions draws them one slot each (the theory's t_f =
    t_b = t_w), so the grid, the simulated bubble and the theory agree; one without W keeps a
    whole B; an explicit --wgrad 0 still drops the W's."""
    r = ppx("schedule", "zb_h1", "-p", "4", "-m", "8")
    head, *grid, last = r.stdout.strip().splitlines()
    assert head == "zb_h1: 4 ranks, 4 stages, 8 microbatches (F = 1 slot, B = 2 slots, I = 1, W = 1)", head
    assert all("W7" in row for row in grid if row.startswith("rank "))
    assert last.startswith("bubble (idle share of the step): simulated 11.1%, theory (p-1)/(3m+p-1)"), last
    r = ppx("schedule", "1f1b", "-p", "4", "-m", "8")
    assert "(F = 1 slot, B = 1 slot)" in r.stdout and "simulated 27.3%" in r.stdout
    r = ppx("schedule", "zb_h1", "-p", "4", "-m", "8", "--wgrad", "0")
    rows = [line for line in r.stdout.splitlines() if line.startswith("rank ")]
    assert len(rows) == 4 and not any(" W" in row for row in rows) and "simulated 27.3%" in r.stdout


def test_drain_draws_whole_bs_where_no_w_fills_the_drain_and_refuses_a_list_without_a_split():
    r = ppx("schedule", "zb_h1", "-p", "2", "-m", "8", "--drain")
    rows = {line.split()[1]: line.split()[2:] for line in r.stdout.splitlines() if line.startswith("rank ")}
    assert rows["1"] == (". F0 B0 B0 F1 B1 B1 F2 B2 B2 F3 B3 B3 F4 B4 B4 F5 B5 B5 F6 I6 . F7 I7 W6 W7".split()), (
        r.stdout
    )  # rank 1 splits only the two microbatches whose W comes after its last F
    assert "simulated 7.7% (split only where a W fills the drain; 4.0% with every backward split" in r.stdout
    assert "theory (p-1)" not in r.stdout
    r = ppx("schedule", "1f1b", "--drain")
    assert r.returncode == 2 and r.stderr == "ppx: error: --drain: 1f1b splits no backward into I and W\n"


def test_a_csv_that_sums_out_of_microbatch_order_is_noted_where_it_is_shown_and_run(tmp_path):
    """Lists of one's own that add stage 1's weight gradients in the order 0, 2, 1, 3, or its
    losses so: `ppx schedule` and `ppx run` (for the run's list, and a run.paired entry's,
    under its name) say so before their losses differ from 1F1B's in the last digits; they
    differ by no more than rounding."""
    rank0 = "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n"
    weights, loss = tmp_path / "weights.csv", tmp_path / "loss.csv"
    weights.write_text(rank0 + "1F0,1B0,1F1,1I1,1F2,1B2,1W1,1F3,1B3\n")
    loss.write_text(rank0 + "1F0,1F2,1F1,1F3,1B0,1B1,1B2,1B3\n")
    later = "a sum in another order than every family's, so its results may differ from theirs in the last digits (rounding)"
    said = {
        weights: f"{weights} adds stage 1's weight gradients of microbatch 1 after microbatch 2's: {later}",
        loss: f"{loss} adds microbatch 1's loss after microbatch 2's (its last stage's forwards): {later}",
    }
    r = ppx("schedule", str(weights))
    assert r.returncode == 0 and f"note: {said[weights]}" in r.stdout, r.stdout + r.stderr
    assert "note:" not in ppx("schedule", "zb_h1", "-p", "2", "-m", "4").stdout  # (every family's list: in order)
    entry = f"pipeline.schedule={loss}"
    run = tmp_path / "run"
    r = ppx(
        "run",
        "1f1b_2cpu",
        f"pipeline.schedule={weights}",
        "train.steps=4",
        f"run.paired=['{entry}', 'pipeline.schedule=1f1b']",
        f"run.dir={run}",
        "logging.report=false",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    notes = [line for line in r.stderr.splitlines() if line.startswith("ppx: note:")]
    assert notes == [f"ppx: note: {said[weights]}", f"ppx: note: run.paired '{entry}': {said[loss]}"], r.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sums_out_of_order"] == said[weights].removeprefix(f"{weights} ")  # (the run's own list)
    assert {p.name: p.read_text() for p in (run / "schedules").iterdir()} == {p.name: p.read_text() for p in said}
    rows = summary["paired"]
    assert rows[entry]["sums_out_of_order"] == ["run", "entry"] and rows["pipeline.schedule=1f1b"][
        "sums_out_of_order"
    ] == ["run"]
    for row in rows.values():  # (said beside the losses where they differ)
        assert row["losses_equal"] or row["max_loss_difference"] < 1e-5, row


def test_a_csv_without_a_backward_runs_forward_only_and_says_so(tmp_path):
    csv = tmp_path / "forwards.csv"
    csv.write_text("0F0,0F1\n1F0,1F1\n")
    r = ppx(
        "run",
        "1f1b_2cpu",
        f"pipeline.schedule={csv}",
        "pipeline.microbatches=2",
        "train.steps=2",
        f"run.dir={tmp_path / 'run'}",
        "logging.report=false",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"ppx: note: {csv} holds no backward (B, or I and W): the run computes forwards and losses only" in r.stderr


def test_a_csv_whose_rows_put_stages_on_other_ranks_says_where(tmp_path):
    """One stage per rank: the grid names no stage, so rows swapped by mistake would look alike."""
    csv = tmp_path / "swapped.csv"
    csv.write_text("1F0,1F1,1B0,1B1\n0F0,0F1,0B0,0B1\n")
    out = ppx("schedule", str(csv)).stdout.splitlines()
    assert out[1] == "stages on other ranks than their number: stage 0 on rank 1, stage 1 on rank 0", out
    assert not any(
        line.startswith("stages on") for line in ppx("schedule", "1f1b", "-p", "2", "-m", "2").stdout.splitlines()
    )
    csv.write_text("0F0,0B0\n2F0,2B0\n1F0,1B0\n")
    out = ppx("schedule", str(csv)).stdout.splitlines()
    assert out[1] == "stages on other ranks than their number: stage 0 on rank 0, stage 1 on rank 2, stage 2 on rank 1"
    csv.write_text("0F0,0B0\n\n1F0,1B0\n")  # (a blank row is no idle rank: every rank holds a stage)
    r = ppx("schedule", str(csv))
    assert (r.returncode, r.stdout) == (2, "") and "row 1 holds no action" in r.stderr, r.stderr


def test_a_csv_holding_its_stages_unevenly_refuses_any_virtual_option(tmp_path):
    """Ranks holding 1 and 2 stages: -v 1 was taken (the rounded-down count), -v 2 said "1 stage each"."""
    csv = tmp_path / "uneven.csv"
    csv.write_text("0F0,0F1,0B0,0B1\n1F0,2F0,1F1,2F1,2B0,1B0,2B1,1B1\n")
    assert ppx("schedule", str(csv)).returncode == 0
    for v in ("1", "2"):
        r = ppx("schedule", str(csv), "-v", v)
        assert r.returncode == 2, r.stdout
        assert r.stderr.strip() == (
            f"ppx: error: {csv} is a schedule for 2 ranks, placing its stages unevenly (rank 0 1, rank 1 2), and "
            f"2 microbatches; --virtual {v} does not match (leave it out)"
        )


def test_a_simulated_bubble_prints_as_its_theory_and_a_refused_torch_shape_says_only_why():
    # 1/16 simulated at costs in ms comes out 0.06250000000000003: it printed 6.3% beside 6.2%
    r = ppx("simulate", "1f1b", "-p", "2", "-m", "15", "--fwd-ms", "10", "--bwd-ms", "10")
    assert "bubble 6.2% (idle / step time)" in r.stdout and "theory ((p-1)/(m+p-1)): 6.2%" in r.stdout, r.stdout
    r = ppx("schedule", "torch_1f1b", "-p", "4", "-m", "3")  # (it said what torch runs, then refused)
    assert (r.returncode, r.stdout) == (2, "") and r.stderr.count("\n") == 1, (r.stdout, r.stderr)


@pytest.mark.skipif(not os.access("/dev/full", os.W_OK) or not os.access("/dev", os.W_OK), reason="no /dev/full")
def test_a_csv_that_cannot_be_written_is_one_line_naming_it():
    """A full disk (/dev/full) said "No space left on device" alone, naming neither option nor
    file, and only after the grid and bubble were printed: the CSV is written first."""
    r = ppx("schedule", "1f1b", "-p", "2", "-m", "4", "--csv", "/dev/full")
    assert (r.returncode, r.stdout, r.stderr) == (
        2,
        "",
        "ppx: error: --csv /dev/full: could not write it (No space left on device)\n",
    )
    assert Path("/dev/full").is_char_device()  # (written in place: a file renamed over it replaced the device)
    r = ppx("schedule", "1f1b", "-p", "2", "-m", "2", "--csv", "/dev/stdout")
    assert r.returncode == 0 and "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n" in r.stdout, r.stderr


def test_a_csv_cut_short_is_not_left_behind(tmp_path):
    """A write that fails part way (a file-size limit: RLIMIT_FSIZE) left a part of the list,
    which a later run would read as the whole: the part is removed, in one line."""
    import resource
    import subprocess
    import sys

    out = tmp_path / "zb.csv"
    cmd = [sys.executable, "-m", "ppx.cli", "schedule", "zb_h1", "-p", "4", "-m", "32", "--csv", str(out)]
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (256, resource.RLIM_INFINITY))  # noqa: E731
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, preexec_fn=limit, timeout=60)
    assert (r.returncode, r.stderr) == (2, f"ppx: error: --csv {out}: could not write it (File too large)\n")
    assert list(tmp_path.iterdir()) == []
    # a list there before stays whole (it was removed with the part written over it)
    out.write_text("0F0,0B0\n")
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, preexec_fn=limit, timeout=60)
    assert r.returncode == 2 and out.read_text() == "0F0,0B0\n" and list(tmp_path.iterdir()) == [out]


def test_a_picture_that_cannot_be_written_names_its_file_and_leaves_the_one_before(tmp_path):
    """matplotlib's failed write said "File too large" alone; a picture is written beside its
    path and renamed over it, so the one there before stays whole and no part is left."""
    import resource
    import subprocess
    import sys

    out = tmp_path / "grid.png"
    out.write_bytes(b"the picture before")
    cmd = [sys.executable, "-m", "ppx.cli", "simulate", "1f1b", "--png", str(out)]
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))  # noqa: E731
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, preexec_fn=limit, timeout=60)
    # (the last line: matplotlib's font cache, written on a first use, may warn before it)
    assert (r.returncode, r.stderr.splitlines()[-1:]) == (2, [f"ppx: error: File too large: {out}"]), r.stderr
    assert out.read_bytes() == b"the picture before" and [p.name for p in tmp_path.iterdir()] == ["grid.png"]
    assert ppx("simulate", "1f1b", "--png", str(out)).returncode == 0 and out.read_bytes()[:4] == b"\x89PNG"


def test_a_receive_lookahead_under_nccl_is_refused():
    """NCCL posts each receive in order: the simulator silently took no lookahead there."""
    how = "each receive is posted in order, right before its use: leave it out, or give --transport gloo\n"
    for given, nccl in (
        (["--recv-lookahead", "2"], "the default --transport nccl"),
        (["--transport", "nccl", "--recv-lookahead", "-1"], "--transport nccl"),
    ):
        r = ppx("simulate", "1f1b", *given)
        k = given[-1]
        said = f"ppx: error: --recv-lookahead {k} is gloo's (receives posted early); under nccl ({nccl}) {how}"
        assert (r.returncode, r.stdout, r.stderr) == (2, "", said), r.stderr
    for given in (["--recv-lookahead", "0"], ["--transport", "gloo", "--recv-lookahead", "2"]):  # (nccl's own; gloo's)
        assert ppx("simulate", "1f1b", *given).returncode == 0
