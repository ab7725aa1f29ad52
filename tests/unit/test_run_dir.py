"""`RunDir`: a run directory read back typed (summary, config, env, metrics), with a one-line
`UserError` for a missing file; `ppx compare`'s rows come from it."""

import json

import pytest

from ppx import config
from ppx.errors import UserError
from ppx.report.run_dir import RunDir, Summary

SUMMARY = {
    "status": "completed",
    "experiment": "hand",
    "schedule": "1f1b",
    "stages": 2,
    "microbatches": 4,
    "world_size": 2,
    "device": "cpu",
    "backend": "gloo",
    "steps": 2,
    "batch_size": 32,
    "model": "mlp",
    "virtual_stages": 1,
    "losses": [0.5, 0.25],
    "step_times_s": [0.01, 0.012],
    "step_time_s": 0.011,
    "bubble_fraction": 0.3,
    "ranks": [
        {"rank": 0, "compute_s": 0.005, "peak_activation_bytes": 2048, "peak_memory_bytes": 2**21},
        {"rank": 1, "compute_s": 0.006, "peak_activation_bytes": 4096},
    ],
    "bubble_fraction_theory": 0.2,
    "throughput_samples_per_s": 2909.0,
    "measured_costs": {
        "action_s": {"0F": 0.001, "0B": 0.002, "1F": 0.001, "1B": 0.002},
        "p2p_s": 0.0001,
        "overhead_s": 0.0,
        "send_post_s": 0.0,
        "recv_post_s": 0.0,
    },
    "predicted": {"step_time_s": 0.01, "bubble_fraction": 0.25, "draws": 64},
    "measured_step_time_s": 0.0115,
    "prediction_error": {"step_time": 0.15, "bubble_fraction": 0.04},
    "measured_bubble_fraction": 0.29,
}


@pytest.fixture
def run(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps(SUMMARY, indent=2) + "\n")
    cfg = config.load("1f1b_2cpu", ["train.steps=2"])
    (d / "config.yaml").write_text(config.to_yaml(cfg))
    (d / "env.json").write_text(json.dumps({"backend": "gloo", "world_size": 2}))
    lines = [json.dumps({"step": k, "loss": loss}) + "\n" for k, loss in enumerate(SUMMARY["losses"])]
    (d / "metrics.jsonl").write_text("".join(lines))
    return d


def test_a_complete_run_reads_back_typed(run):
    rd = RunDir(run)
    assert rd.path == run and rd.is_complete
    s = rd.summary
    assert isinstance(s, Summary) and (s.schedule, s.world_size, s.microbatches, s.virtual) == ("1f1b", 2, 4, 1)
    assert s.losses == (0.5, 0.25) and s.final_loss == 0.25
    assert s.predicted_bubble_fraction == 0.25 and s.prediction_error_bubble_fraction == 0.04
    assert (s.peak_activation_bytes, s.peak_memory_bytes) == (4096, 2**21)
    assert s.ranks[1].peak_memory_bytes is None and s.ranks[0].compute_s == 0.005
    assert (s.step_time_of_costs_s, s.bubble_of_costs) == (0.0115, 0.29)
    assert s.measured_costs["action_s"]["1B"] == 0.002
    assert rd.raw_summary == SUMMARY  # the file as written stays available
    assert rd.config.pipeline.schedule == "1f1b" and rd.config.train.steps == 2
    assert rd.env == {"backend": "gloo", "world_size": 2}
    assert [m["step"] for m in rd.metrics] == [0, 1]


def test_optional_fields_are_none_and_derived_ones_fall_back(run):
    minimal = {k: SUMMARY[k] for k in ("schedule", "world_size", "microbatches", "step_time_s", "batch_size")}
    (run / "summary.json").write_text(json.dumps(minimal))
    (run / "env.json").unlink()
    rd = RunDir(run)
    s = rd.summary
    assert s.bubble_fraction is None and s.predicted_bubble_fraction is None and s.measured_costs is None
    assert s.virtual == 1 and s.final_loss is None and s.peak_memory_bytes is None  # (not measured: not 0)
    assert s.throughput == pytest.approx(32 / 0.011) and s.step_time_of_costs_s == 0.011
    assert rd.env is None


def test_a_missing_file_is_a_one_line_user_error(run):
    (run / "summary.json").unlink()
    rd = RunDir(run)
    assert not rd.is_complete
    with pytest.raises(UserError) as e:
        _ = rd.summary
    assert str(e.value) == f"{run} has no summary.json (the run did not complete)" and "\n" not in str(e.value)
    (run / "config.yaml").unlink()
    with pytest.raises(UserError, match="has no config.yaml$"):
        _ = rd.config
    with pytest.raises(UserError, match="is not a run directory"):
        RunDir(run / "nowhere")
    (run / "summary.json").write_text(json.dumps({"schedule": "1f1b"}))
    with pytest.raises(UserError, match="summary.json has no world_size, microbatches, step_time_s"):
        _ = RunDir(run).summary


def test_compare_rows_come_from_the_run_dir(run):
    from ppx.report.compare import load_row
    from ppx.report.found_runs import find_runs

    (found,) = find_runs([str(run.parent)])
    row = load_row(found, run.parent)
    assert row["name"] == "run" and row["path"] == str(run)
    assert (row["schedule"], row["world_size"], row["microbatches"], row["v"]) == ("1f1b", 2, 4, 1)
    assert row["step_ms"] == pytest.approx(11.0) and row["throughput"] == 2909.0
    assert (row["bubble"], row["theory"], row["predicted"]) == (0.3, 0.2, 0.25)
    assert row["predicted_error_pt"] == pytest.approx(4.0)
    assert (row["peak_act_kib"], row["peak_mem_mib"], row["final_loss"]) == (4.0, 2.0, 0.25)
    # a forward-only run saves nothing: 0 is its measurement, the table's 0.0, not "-" (not measured)
    saved_nothing = dict(SUMMARY, ranks=[{"rank": r, "peak_activation_bytes": 0} for r in (0, 1)])
    (run / "summary.json").write_text(json.dumps(saved_nothing))
    row = load_row(find_runs([str(run.parent)])[0], run.parent)
    assert (row["peak_act_kib"], row["peak_mem_mib"]) == (0.0, None)


def test_pictures_draw_the_timeline_steps_bubble_beside_the_prediction():
    """The prediction is of the timeline steps: the measured point beside it is theirs, the
    median over every step only where a run has no timeline."""
    from ppx.report.compare import bubble_series

    row = {"schedule": "1f1b", "world_size": 2, "v": 1, "theory": 0.2, "predicted": 0.25}
    rows = [dict(row, microbatches=4, bubble=0.3, timeline_bubble=0.26), dict(row, microbatches=8, bubble=0.1)]
    rows[1]["timeline_bubble"] = None
    (series,) = bubble_series(rows)
    assert series["measured"] == [(4, 0.26), (8, 0.1)] and series["predicted"] == [(4, 0.25), (8, 0.25)]


def test_compare_leaves_out_a_run_that_did_not_complete_and_says_so(run, capsys):
    from ppx.report.found_runs import find_runs

    failed = run.parent / "failed"
    failed.mkdir()
    (failed / "incomplete.txt").write_text("rank 1 died: killed by signal SIGKILL (9) on 1B1 (step 0)\n")
    (found,) = find_runs([str(run.parent / "*")])
    assert found.path == run
    assert capsys.readouterr().err == f"ppx compare: left out 1 run(s) that did not complete: {failed}\n"
    with pytest.raises(UserError, match=f"no completed run .* \\(1 that did not complete: {failed}\\)"):
        find_runs([str(failed)])
    # every process killed at once (SIGKILL, an OOM killer): no incomplete.txt, but a run's files
    killed = run.parent / "killed"
    killed.mkdir()
    (killed / "config.yaml").write_text((run / "config.yaml").read_text())
    (killed / "env.json").write_text("{}")
    project = run.parent / "project"  # a config.yaml of one's own is no run
    project.mkdir()
    (project / "config.yaml").write_text("a: 1\n")
    (found,) = find_runs([str(run.parent)])
    assert found.path == run
    assert capsys.readouterr().err == f"ppx compare: left out 2 run(s) that did not complete: {failed}, {killed}\n"


def test_a_run_that_failed_after_its_summary_did_not_complete(run, capsys):
    """A job that failed once summary.json was written (in its report, its last barrier) leaves
    incomplete.txt beside it: compare and a sweep's tally counted it complete."""
    from ppx.report.found_runs import find_runs

    late = run.parent / "late"
    late.mkdir()
    for f in run.iterdir():
        (late / f.name).write_text(f.read_text())
    assert RunDir(late).is_complete
    (late / "incomplete.txt").write_text("stopped: ppx run received SIGTERM after 3.1 s and ended the job\n")
    assert not RunDir(late).is_complete and RunDir(run).is_complete
    (found,) = find_runs([str(run.parent)])
    assert found.path == run
    assert capsys.readouterr().err == f"ppx compare: left out 1 run(s) that did not complete: {late}\n"
    with pytest.raises(UserError, match=f"no completed run .* \\(1 that did not complete: {late}\\)"):
        find_runs([str(late)])


def test_simulate_from_run_reads_summary_config_and_env(run, capsys):
    from ppx.cli import main

    assert main(["simulate", "1f1b", "--from-run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "1f1b: 2 ranks, 2 stages, 4 microbatches" in out
    assert f"measured in {run}: step 11.50 ms" in out and "bubble 29.0%" in out
    (run / "summary.json").unlink()
    assert main(["simulate", "1f1b", "--from-run", str(run)]) == 2
    assert capsys.readouterr().err.strip() == f"ppx: error: {run} has no summary.json (the run did not complete)"
    # the known-cost model's run: its theory at its stages' own costs, as ppx run says it (the
    # closed form at equal costs said 27.3% beside a run of theory 40.0%)
    (run / "summary.json").write_text(json.dumps({**SUMMARY, "bubble_fraction_theory": 0.4}))
    cfg = config.load("1f1b_2cpu", ["train.steps=2", "model.kind=synthetic"])
    (run / "config.yaml").write_text(config.to_yaml(cfg))
    assert main(["simulate", "1f1b", "--from-run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "theory (the known-cost model's, each stage at its own costs): 40.0%" in out and "(p-1)/(m+p-1)" not in out
    # a folder of runs (a sweep's, run.root) is no run: said so, not "the run did not complete"
    (run / "summary.json").write_text("{}")
    assert main(["simulate", "1f1b", "--from-run", str(run.parent)]) == 2
    said = f"ppx: error: {run.parent} is not a run directory (no config.yaml beside a run's files); it holds runs: name one of them"
    assert capsys.readouterr().err.strip() == said


def test_stages_per_rank_come_from_the_stages_over_the_ranks():
    """A CSV run's summary from before it recorded its own stages per rank said 1: the
    stages over the ranks tell; a summary without stages keeps its field."""
    base = {"schedule": "zbv.csv", "world_size": 2, "microbatches": 4, "step_time_s": 0.1}
    assert Summary.from_dict({**base, "stages": 4, "virtual_stages": 1}).virtual == 2
    assert Summary.from_dict({**base, "stages": 2, "virtual_stages": 1}).virtual == 1
    assert Summary.from_dict({**base, "virtual_stages": 3}).virtual == 3
