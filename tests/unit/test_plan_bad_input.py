"""`ppx plan`'s bad input: each one line ``ppx: error: ...`` and exit 2, before any file is
written (through the command's entry point; tests/e2e/test_plan_command.py runs a few as a
user would)."""

from __future__ import annotations

import json

import pytest

from ppx.cli import main

COSTS = ["--fwd-ms", "10", "--bwd-ms", "20"]
CASES = {
    "malformed size": (COSTS + ["--mem-budget", "40GiBs"], "--mem-budget '40GiBs': give a size in bytes"),
    "malformed act bytes": (COSTS + ["--act-bytes", "lots"], "--act-bytes 'lots': give a size"),
    "two budgets": (COSTS + ["--mem-budget", "1GiB,2GiB"], "--mem-budget 1GiB,2GiB: give one size per rank"),
    "a budget with no bytes": (COSTS + ["--mem-budget", "40GiB"], "--mem-budget 40GiB: nothing to hold against it"),
    "malformed ms": (["--fwd-ms", "ten", "--bwd-ms", "20"], "--fwd-ms ten: give milliseconds"),
    "negative ms": (["--fwd-ms", "-1", "--bwd-ms", "20"], "--fwd-ms must not be negative"),
    # (a value that starts with a dash and is no plain number: argparse said "expected one argument")
    "negative ms in a list": (["--fwd-ms", "-1,2", "--bwd-ms", "20"], "--fwd-ms must not be negative"),
    "negative size": (COSTS + ["--act-bytes", "1GiB", "--mem-budget", "-5GiB"], "--mem-budget '-5GiB': give a size"),
    "nan ms": (["--fwd-ms", "10", "--bwd-ms", "nan"], "--bwd-ms must be finite milliseconds, got nan"),
    "infinite ms in a list": (["--fwd-ms", "1,inf", "--bwd-ms", "2"], "--fwd-ms must be finite milliseconds"),
    # finite, but a step's sum of them is not (the plan ranked infinite steps)
    "ms too large to add": (["--fwd-ms", "1e308", "--bwd-ms", "2"], "--fwd-ms must be at most 1e+12 ms"),
    "no work at all": (["--fwd-ms", "0", "--bwd-ms", "0,0"], "--fwd-ms, --bwd-ms and --wgrad-ms are all 0"),
    "lists of two lengths": (["--fwd-ms", "1,2,3", "--bwd-ms", "1,2"], "cost lists of different lengths"),
    "list against --stages": (COSTS[:1] + ["1,2,3"] + COSTS[2:] + ["--stages", "4"], "--stages 4 but the cost lists"),
    "bytes of another length": (
        ["--fwd-ms", "1,2", "--bwd-ms", "1", "--param-bytes", "1GiB,2GiB,3GiB"],
        "cost lists of different lengths: --fwd-ms 2, --bwd-ms 1, --param-bytes 3",
    ),
    "neither source": ([], "give costs: --from-run DIR, or --fwd-ms and --bwd-ms"),
    "only fwd": (["--fwd-ms", "10"], "give costs: --from-run DIR"),
    "from-run and flags": (
        ["--from-run", ".", "--fwd-ms", "10"],
        "--from-run takes the run's costs; leave out --fwd-ms",
    ),
    "unknown schedule": (COSTS + ["--schedules", "1f1b,zz_top"], "--schedules: unknown 'zz_top'; choose all or from"),
    "p list without per-layer": (COSTS + ["--stages", "2,4"], "--stages takes one p with per-stage costs"),
    "p above the layers": (
        ["--per-layer", "--fwd-ms", "1,1,1,1", "--bwd-ms", "1", "--stages", "2,8"],
        "--stages 8 but the costs are of 4 layers",
    ),
    "per-layer of one value": (["--per-layer"] + COSTS, "--per-layer: give one value per layer"),
    "bytes against --stages": (COSTS + ["--stages", "4", "--act-bytes", "1MiB,2MiB"], "--stages 4 but the cost"),
    "bad m": (COSTS + ["--microbatches", "8,x"], "--microbatches 8,x: give whole numbers"),
    "zero v": (COSTS + ["--virtual", "0"], "--virtual 0: every value must be >= 1"),
    "zero jobs": (COSTS + ["--jobs", "0"], "--jobs must be >= 1"),
    "more jobs than CPUs": (COSTS + ["--jobs", "100000"], "--jobs 100000: this process may use "),
    "a list larger than ppx builds": (
        COSTS + ["--stages", "8", "--microbatches", "40000", "--schedules", "1f1b,zb_h1,zbv"],
        "no candidate to plan: 1f1b, zb_h1: 8 ranks x 1 stages x 40000 microbatches = 320000 stage-microbatches: "
        "ppx builds lists of at most 262144 (up to about 15 s of building and checking on 2 cores); zbv: 8 ranks x 2 stages",
    ),
    "negative close": (COSTS + ["--close-pct", "-1"], "--close-pct must be >= 0, got -1"),
    "zero top": (COSTS + ["--top", "0"], "--top must be >= 1"),
    "negative p2p": (COSTS + ["--p2p-ms", "-2"], "--p2p-ms must be >= 0"),
    "calibrate and machine-from": (
        COSTS + ["--calibrate", "--machine-from", "."],
        "--calibrate gives this machine's overhead and hand-off; leave out --machine-from",
    ),
    "calibrate and overhead": (
        COSTS + ["--overhead-ms", "1", "--calibrate", "new"],
        "--calibrate gives this machine's overhead and hand-off; leave out --overhead-ms",
    ),
    "machine-from and p2p": (
        COSTS + ["--machine-from", ".", "--p2p-ms", "1"],
        "--machine-from gives this machine's overhead and hand-off; leave out --p2p-ms",
    ),
    "calibrate a cluster's p": (
        ["--per-layer", "--fwd-ms", ",".join(["1"] * 16), "--bwd-ms", "1", "--stages", "16", "--calibrate"],
        "--calibrate measures this machine with p CPU ranks; p=16 is a cluster's",
    ),
    "from-run and calibrate": (["--from-run", ".", "--calibrate"], "leave out --calibrate"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_exit_2_before_any_work(tmp_path, capsys, name):
    argv, want = CASES[name]
    out = tmp_path / "plan"
    code = main(["plan", *argv, "--out", str(out), "--jobs" if "--jobs" not in argv else "--top", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("ppx: error: ") and "\n" not in err, err
    assert want in err, err
    assert not out.exists()


@pytest.mark.parametrize("option", [["--p2p-ms", "nan"], ["--close-pct", "inf"], ["--overhead-ms", "x"]])
def test_a_numeric_option_that_is_no_finite_number_is_one_line(tmp_path, capsys, option):
    """argparse's own errors are one line too (the usage is a -h away)."""
    with pytest.raises(SystemExit) as exit_:
        main(["plan", *COSTS, *option, "--out", str(tmp_path / "plan")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"ppx plan: error: argument {option[0]}: not a ") and err.endswith("(usage: ppx plan -h)\n")
    assert not (tmp_path / "plan").exists()


def test_a_run_without_measured_costs_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text('{"schedule": "1f1b", "world_size": 2, "microbatches": 4, "step_time_s": 0.1}')
    (run / "config.yaml").write_text("pipeline:\n  schedule: 1f1b\n")
    code = main(["plan", "--from-run", str(run), "--out", str(tmp_path / "plan"), "--jobs", "1"])
    err = capsys.readouterr().err.strip()
    assert (
        code == 2
        and err == f"ppx: error: {run} has no measured costs (run it with instrument.timers and instrument.timeline on)"
    )


def _run_of(tmp_path, schedule: str, action_s: dict):
    run = tmp_path / schedule
    run.mkdir()
    summary = {"schedule": schedule, "world_size": 2, "microbatches": 4, "step_time_s": 0.01}
    summary["measured_costs"] = {"action_s": action_s, "p2p_s": 0.0}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "config.yaml").write_text(f"pipeline:\n  schedule: {schedule}\n")
    return run


def test_costs_from_a_run_that_trains_nothing_or_never_split_are_refused(tmp_path, capsys):
    """A forward-only run's backward costs are unknown, not 0; a run that never split, its I
    and W (`ppx plan` already left such candidates out)."""
    forward = _run_of(tmp_path, "forward_only", {"0F": 0.001, "1F": 0.001})
    for argv in (
        ["plan", "--from-run", str(forward), "--out", str(tmp_path / "plan")],
        ["simulate", "1f1b", "--from-run", str(forward)],
    ):
        assert main(argv) == 2
        assert (
            capsys.readouterr().err.strip()
            == f"ppx: error: {forward} measured no backward (forward_only trains nothing): take the costs from a run that trains"
        )
    assert main(["simulate", "forward_only", "--from-run", str(forward)]) == 0  # the run's own kind of schedule
    capsys.readouterr()
    whole = _run_of(tmp_path, "gpipe", {"0F": 0.001, "1F": 0.001, "0B": 0.002, "1B": 0.002})
    assert main(["simulate", "zb_h1", "--from-run", str(whole)]) == 2
    assert "never split its backward, so its I and W costs are unknown" in capsys.readouterr().err
    assert main(["simulate", "1f1b", "--from-run", str(whole)]) == 0
    capsys.readouterr()
    assert main(["simulate", "1f1b", "--from-run", str(whole), "--fwd-ms", "5"]) == 2  # (it was ignored)
    assert capsys.readouterr().err.strip() == "ppx: error: --from-run takes the run's costs; leave out --fwd-ms"


@pytest.mark.parametrize("argv", [["run", "1f1b_2cpu", "--steps", "3"], ["plan", *COSTS, "--bogus"]])
def test_an_unknown_option_names_its_sub_commands_usage(argv, capsys):
    """(It pointed at ``ppx -h``, which lists the sub-commands, not ``--steps``'s absence.)"""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"ppx {argv[0]}: error: unrecognized arguments: ") and err.endswith(
        f"(usage: ppx {argv[0]} -h)\n"
    )
