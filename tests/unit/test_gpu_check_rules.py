"""`ppx gpu-check`'s checks on hand-made figures (the CUDA-only ones: kernels in a trace, peak
allocated bytes, overlapped spans on two streams, NCCL runs): each check's arithmetic, and a
case each way, so a check that cannot fail is caught. Their arithmetic on real run files is
tested in tests/e2e/test_gpu_check.py."""

from __future__ import annotations

import math

import pytest

from ppx.errors import UserError
from ppx.gpucheck import memory, nccl, overlap, precision, profiler, report, split, throughput
from ppx.gpucheck.machine import Machine
from ppx.gpucheck.orchestrate import CHECKS, _judge, plans
from ppx.gpucheck.runs import Missing, Runner, RunResult, RunSpec
from ppx.gpucheck.verdict import FAIL, PASS, SKIPPED, Outcome, failed, judged, overall, skipped


def test_ranks_are_a_power_of_two_of_the_gpus():
    assert [Machine("cuda", g).ranks(4) for g in (1, 2, 3, 4, 5, 8)] == [1, 2, 2, 4, 4, 4]
    assert Machine("cuda", 8).ranks(8) == 8 and Machine("cpu", 0, small=True).ranks(4) == 1


def test_a_checks_verdict_is_its_worst_judged_row():
    ok, bad = judged("a", 0.0, True, "0", "t"), judged("b", 1.0, False, "1", "t")
    gone = skipped("c", "why", "t")
    assert overall([ok, gone]) == PASS and overall([ok, bad, gone]) == FAIL and overall([gone]) == SKIPPED


KERNEL = {"ph": "X", "cat": "kernel", "name": "ampere_sgemm", "ts": 150, "dur": 20, "args": {"correlation": 7}}


def _label(name, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": f"PP:{name}", "ts": ts, "dur": dur, "tid": 1}


def _launch(ts, correlation):
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "ts": ts,
        "dur": 5,
        "args": {"correlation": correlation},
    }


def test_kernels_are_found_under_the_labels_that_launched_them():
    """A launch inside the label's range whose kernel is in the trace counts; a launch outside
    it, or one whose kernel never ran, does not; comm labels are not compute actions."""
    events = [_label("0F0", 100, 50), _launch(110, 7), KERNEL, _label("0B0", 200, 50), _launch(300, 7)]
    events += [_label("0B1", 400, 50), _launch(410, 99), _label("0SEND_F0", 500, 10)]
    events.append({**_label("0F0", 140, 40), "cat": "gpu_user_annotation"})  # the GPU's copy of a range: not a label
    held, total, empty = profiler.kernels_under_labels(events)
    assert (held, total, empty) == (1, 3, ["PP:0B0", "PP:0B1"])
    assert profiler.judge_kernels({0: (held, total, empty)})[1] is False
    assert profiler.judge_kernels({0: (3, 3, []), 1: (2, 2, [])})[1:] == (True, "5 of 5")
    assert profiler.judge_kernels({0: (0, 0, [])})[1] is False  # no compute label at all


def test_profiler_steps_against_step_s():
    metrics = [{"step": 2, "ranks": [{"rank": 0, "step_s": 0.100}, {"rank": 1, "step_s": 0.200}]}]
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "ts": 0, "dur": 104_000}]
    events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#2", "ts": 10, "dur": 50_000})
    errors = profiler.step_errors(events, metrics, 0)
    assert errors == {2: pytest.approx(0.04)}
    assert profiler.judge_steps({0: errors})[1] is True
    assert profiler.judge_steps({1: profiler.step_errors(events, metrics, 1)})[1] is False  # 104 ms vs 200 ms
    assert profiler.judge_steps({0: {}})[1] is False


def _rank(rank, peak, params, act):
    return {"rank": rank, "peak_memory_bytes": peak, "param_bytes": params, "predicted_peak_activation_bytes": act}


def test_memory_model_adds_weights_gradients_optimizer_state_and_saved_activations():
    assert memory.predicted_peak(_rank(0, 0, 100, 1000), "sgd") == 1200
    assert memory.predicted_peak(_rank(0, 0, 100, 1000), "adamw") == 1400
    assert memory.predicted_peak({"rank": 0, "param_bytes": 1}, "sgd") is None
    ok = memory.rank_errors({"ranks": [_rank(0, 1254, 100, 1000), _rank(1, 1150, 100, 1000)]}, "sgd")
    assert [round(e["error"], 4) for e in ok] == [0.045, -0.0417]
    assert memory.judge_errors(ok)[1] is True
    bad = memory.rank_errors({"ranks": [_rank(0, 1200, 100, 1000), _rank(1, 1300, 100, 1000)]}, "sgd")
    value, passed, figure = memory.judge_errors(bad)
    assert not passed and value == pytest.approx(1300 / 1200 - 1) and "worst +8.33%" in figure


def _slice(name, start, end, step=0, rank=0):
    return {"name": name, "cat": "compute", "rank": rank, "step": step, "start_s": start, "end_s": end}


def test_overlapped_cell_time_against_f_and_b_apart():
    pairs = [("1F1", "0B0")]
    side_by_side = [
        _slice("1F1", 0.0, 0.010),
        _slice("0B0", 0.0, 0.020),
        _slice("1F1", 1.0, 1.010, 1),
        _slice("0B0", 1.0, 1.020, 1),
    ]
    queued = [_slice("1F1", 0.0, 0.010), _slice("0B0", 0.010, 0.030)]
    apart = {pairs[0]: 0.030}
    r = overlap.ratios(overlap.cell_times(side_by_side, pairs), apart)
    assert r == {pairs[0]: pytest.approx(2 / 3)}
    assert overlap.judge_known_cost(r, 2 / 3)[1] is True and overlap.judge_real(r)[1] is True
    r = overlap.ratios(overlap.cell_times(queued, pairs), apart)
    assert r == {pairs[0]: pytest.approx(1.0)}
    assert overlap.judge_known_cost(r, 2 / 3)[1] is False and overlap.judge_real(r)[1] is False
    run_apart = [
        _slice("1F1", 0.0, 0.011),
        _slice("0B0", 0.02, 0.041),
        _slice("1F1", 1.0, 1.009, 1),
        _slice("0B0", 1.02, 1.039, 1),
    ]
    assert overlap.apart_times(run_apart, pairs) == {pairs[0]: pytest.approx(0.030)}  # median of 0.032 and 0.028


def test_overlap_pairs_and_the_csv_without_cells():
    pairs = overlap.cells()
    assert pairs[0] == ("1F1", "0B0") and len(pairs) == 13
    rows = overlap.apart_csv().strip().splitlines()
    assert len(rows) == 1 and "OVERLAP" not in rows[0] and rows[0].split(",")[4:6] == ["1F1", "0B0"]


def test_loss_gaps():
    a = [5.5, 5.25, 5.0]
    assert precision.loss_gap(a, list(a)) == 0.0
    assert precision.judge_gap(0.0, 0.0)[1] is True
    one_ulp = [math.nextafter(a[0], 9.0), *a[1:]]
    assert precision.judge_gap(precision.loss_gap(one_ulp, a), 0.0)[1] is False  # fp32: equal means equal
    assert precision.judge_gap(precision.loss_gap([5.51, 5.25, 5.0], a), precision.BF16_TOL)[1] is True
    assert precision.judge_gap(precision.loss_gap([5.6, 5.25, 5.0], a), precision.BF16_TOL)[1] is False
    assert precision.loss_gap([float("nan"), 1, 1], a) == math.inf and precision.loss_gap(a[:2], a) == math.inf


def test_nccl_losses_need_an_nccl_run_and_the_bubble_its_theory():
    gpu, cpu = {"losses": [1.0, 0.9], "backend": "nccl"}, {"losses": [1.0, 0.9 * (1 + 5e-6)], "backend": "gloo"}
    assert nccl.judge_losses(gpu, cpu)[1] is True
    assert nccl.judge_losses({**gpu, "losses": [1.0, 0.9 * (1 + 3e-5)]}, cpu)[1] is False
    assert nccl.judge_losses({**gpu, "backend": "gloo"}, cpu)[1] is False  # a run that fell back to CPU proves nothing
    summary = {"bubble_fraction": 0.29, "bubble_fraction_theory": 0.2727, "backend": "nccl"}
    assert nccl.judge_bubble(summary)[1] is True
    assert nccl.judge_bubble({**summary, "bubble_fraction": 0.31})[1] is False


class _Runs:
    """name -> a stand-in run directory, or Missing for the names in ``missing``."""

    def __init__(self, figures: dict, missing: dict):
        self.figures, self.missing = figures, missing

    def __getitem__(self, name):
        if name in self.missing:
            spec = RunSpec.of(name, {"pipeline.stages": 1}, 1.0)
            budget = self.missing[name].startswith("time budget")
            raise Missing(RunResult(spec, why=self.missing[name], budget=budget))
        return self.figures[name]


class _Run:
    def __init__(self, step_s, action_s=None):
        self.metrics = [{"step": k, "step_time_s": step_s, "bubble_fraction": 0.1} for k in range(8)]
        self.raw_summary = {"device": "cuda", "measured_costs": {"action_s": action_s or {}}}
        self.config = type("C", (), {"model": type("M", (), {"seq_len": 512})})()


def test_throughput_pairs_and_runs_that_did_not_happen():
    m = Machine("cuda", 1)
    names = [s.name for s in throughput.plan(m)]
    step = {n: 0.100 for n in names}
    runs = {n: _Run(s) for n, s in step.items()}
    assert throughput.judge(m, _Runs(runs, {})).verdict == PASS
    runs["throughput-1f1b"] = _Run(0.103)  # 3% slower than torch's 1F1B
    out = throughput.judge(m, _Runs(runs, {}))
    assert out.verdict == FAIL and "1f1b 1.030" in out.rows[0].figure
    budget = {n: "time budget: 3 s left" for n in names if n != "throughput-gpipe"}
    assert throughput.judge(m, _Runs(runs, budget)).verdict == SKIPPED  # no pair complete
    out = throughput.judge(m, _Runs(runs, {"throughput-zbv": "exit 1: boom"}))
    assert out.verdict == FAIL and "zbv failed: exit 1: boom" in out.rows[0].figure
    assert throughput.steady(runs["throughput-gpipe"].metrics, 1000)["tokens_per_s"] == pytest.approx(10_000)


def test_split_reads_throughputs_1f1b_and_zb_h1_runs():
    one, two = Machine("cuda", 1), Machine("cuda", 2)
    assert [s.name for s in split.plan(one)] == ["throughput-1f1b", "throughput-zb_h1"]
    # I and W apart on every stage: at p=1 auto would run the one stage whole (its W measuring nothing)
    assert split.plan(one)[1].key("train.split_backward") == "store"
    assert all(s in throughput.plan(two) for s in split.plan(two))  # the same runs: made once
    whole = {"0F": 0.010, "0B": 0.020, "1F": 0.010, "1B": 0.020}
    cheap = {"0F": 0.010, "0I": 0.012, "0W": 0.008, "1F": 0.010, "1I": 0.012, "1W": 0.009}  # 1.00, 1.05
    runs = {"throughput-1f1b": _Run(0.100, whole), "throughput-zb_h1": _Run(0.095, cheap)}
    out = split.judge(two, _Runs(runs, {}))
    assert [r.verdict for r in out.rows] == [PASS, PASS] and out.data["iw_over_b"] == pytest.approx([1.0, 1.05])
    assert out.rows[0].figure == "1.050 (per stage 1.000, 1.050)" and out.rows[1].figure.startswith(
        "0.950 (95.0 / 100.0 ms"
    )
    runs["throughput-zb_h1"] = _Run(0.101, {**cheap, "1W": 0.012})  # 1.20 on stage 1, and slower than 1F1B
    out = split.judge(two, _Runs(runs, {}))
    assert [r.verdict for r in out.rows] == [FAIL, FAIL] and out.rows[0].value == pytest.approx(1.2)
    runs = {"throughput-1f1b": _Run(0.100, whole), "throughput-zb_h1": _Run(0.103, cheap)}
    out = split.judge(one, _Runs(runs, {}))  # one rank: the step is told, not judged
    assert [r.verdict for r in out.rows] == [PASS, SKIPPED] and "1.030 (103.0 / 100.0 ms, p=1)" in out.rows[1].figure
    # the stages paired are those the runs measured, not those the specs asked for
    runs["throughput-zb_h1"] = _Run(0.095, {k: v for k, v in cheap.items() if k != "1I"})
    with pytest.raises(ValueError, match=r"B on stages \[0, 1\], ZB-H1's I on \[0\] and W on \[0, 1\]"):
        split.judge(two, _Runs(runs, {}))


def test_a_missing_run_or_a_broken_check_becomes_rows():
    class Check:
        CRITERIA = [("a", "t"), ("b", "t")]

        def __init__(self, error):
            self.error = error

        def judge(self, machine, runs):
            raise self.error

    spec = RunSpec.of("x", {"pipeline.stages": 1}, 1.0)
    budget = _judge(Check(Missing(RunResult(spec, why="time budget: 1 s left", budget=True))), None, None)
    assert [r.verdict for r in budget.rows] == [SKIPPED, SKIPPED]
    broken = _judge(Check(Missing(RunResult(spec, why="exit 1: boom"))), None, None)
    assert [r.verdict for r in broken.rows] == [FAIL, FAIL] and "run x failed: exit 1: boom" in broken.rows[0].figure
    bug = _judge(Check(KeyError("peak_memory_bytes")), None, None)
    assert bug.verdict == FAIL and "KeyError" in bug.rows[0].figure and "traceback" in bug.data


@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 8])
def test_every_planned_run_has_a_config_ppx_run_accepts(tmp_path, gpus):
    """Each run a GPU machine would make, loaded and its schedule built as `ppx run` does."""
    m = Machine("cuda", gpus)
    runner = Runner(tmp_path, m, deadline=0.0)
    specs = [s for _, p in plans(m) if not isinstance(p, str) for s in p]
    assert len({s.name for s in specs}) == len(set(specs))  # a name two checks plan is one run, the same spec
    assert [e for e in map(runner.check, specs) if e] == []
    assert {c.NAME for c, p in plans(m) if isinstance(p, str)} == ({"nccl"} if gpus == 1 else set())


def test_one_gpus_runs_fit_the_budget_by_their_estimates():
    from ppx.commands.gpu_check import DEFAULT_BUDGET_S

    total = sum(s.estimate_s for s in {s for _, p in plans(Machine("cuda", 1)) if not isinstance(p, str) for s in p})
    assert 0 < total < DEFAULT_BUDGET_S


def test_every_check_has_a_name_title_and_criteria():
    for check in CHECKS:
        assert check.NAME and check.TITLE and check.CRITERIA
        assert isinstance(check.plan(Machine("cuda", 2)), (list, str))


def _result(name: str, *rows):
    class Res:
        title, runs, seconds = "T", [], 1.0

    Res.name, Res.outcome = name, Outcome(list(rows))
    return Res()


FACTS = {"devices": [{"name": "GPU X", "memory_gib": 80, "capability": "sm_90"}], "torch": "2.13", "python": "3.11"}


def test_the_docs_block_is_replaced_and_a_file_without_one_refused(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text(f"before\n{report.BEGIN}\nold table\n{report.END}\nafter\n")
    report.check_doc(doc)
    timers = _result("timers", judged("what", 0.0, True, "0.1%", "within 2%"))
    report.update_doc(doc, FACTS, [timers], "2026-11-25 10:00 UTC", tmp_path / "20261125-100000")
    text = doc.read_text()
    assert "old table" not in text and text.startswith("before\n") and text.endswith("after\n")
    assert "- 2026-11-25 10:00 UTC: timers; 1 x GPU X (80 GiB, sm_90)" in text
    assert "| timers | what | 0.1% | within 2% | **PASS** | 2026-11-25 10:00 UTC |" in text
    (tmp_path / "plain.md").write_text("no markers\n")
    with pytest.raises(UserError, match="no <!-- gpu-check:begin -->"):
        report.check_doc(tmp_path / "plain.md")


def test_partial_reports_add_up_to_one_table(tmp_path):
    """`--only` and the time budget: a later report replaces the rows of the checks it judged
    and keeps the others (and a check it only skipped) with their own report's line."""
    doc = tmp_path / "b.md"
    doc.write_text(f"{report.BEGIN}\n{report.END}\n")
    first = [
        _result("timers", judged("t", 1.0, True, "0.2%", "within 2%")),
        _result("memory", judged("m", 1.0, True, "+3%", "within 5%")),
        _result("overlap", skipped("o", "time budget", "0.667")),
        _result("nccl", judged("n1", 1.0, True, "0", "within 1e-05"), judged("n2", 1.0, True, "0.01", "within 0.03")),
    ]
    report.update_doc(doc, FACTS, first, "2026-11-25 10:00 UTC", tmp_path / "a")
    later = [
        _result("overlap", judged("o", 0.66, True, "0.665", "0.667")),
        _result("memory", skipped("m", "time budget", "within 5%")),
        _result("timers", judged("t", 3.0, False, "3%", "within 2%")),
    ]
    report.update_doc(doc, FACTS, later, "2026-11-25 11:00 UTC", tmp_path / "b")
    lines = doc.read_text().splitlines()
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert rows == [
        "| timers | t | 3% | within 2% | **FAIL** | 2026-11-25 11:00 UTC |",
        "| memory | m | +3% | within 5% | **PASS** | 2026-11-25 10:00 UTC |",
        "| overlap | o | 0.665 | 0.667 | **PASS** | 2026-11-25 11:00 UTC |",
        "| nccl | n1 | 0 | within 1e-05 | **PASS** | 2026-11-25 10:00 UTC |",
        "| nccl | n2 | 0.01 | within 0.03 | **PASS** | 2026-11-25 10:00 UTC |",
    ]  # a check the later report did not run keeps every row, not only its first
    reports = [line for line in lines if line.startswith("- ")]
    assert [r.split(";")[0] for r in reports] == [
        "- 2026-11-25 11:00 UTC: overlap, timers",
        "- 2026-11-25 10:00 UTC: timers, memory, overlap, nccl",
    ]
    report.update_doc(
        doc,
        FACTS,
        [
            _result("memory", judged("m", 1.0, True, "+1%", "within 5%")),
            _result("nccl", judged("n1", 1.0, True, "0", "within 1e-05"), judged("n2", 1.0, True, "0", "within 0.03")),
        ],
        "2026-11-25 12:00 UTC",
        tmp_path / "c",
    )
    reports = [line.split(";")[0] for line in doc.read_text().splitlines() if line.startswith("- ")]
    assert reports == [
        "- 2026-11-25 12:00 UTC: memory, nccl",
        "- 2026-11-25 11:00 UTC: overlap, timers",
    ]  # 10:00's rows all gone


def test_a_skipped_row_keeps_an_earlier_verdict_and_a_cell_keeps_its_pipes(tmp_path):
    """Row by row: one GPU's report skips what two GPUs judged (split's step row) and keeps it;
    a failed run's message with | and a line break stays one row through later updates; a
    check ppx no longer has leaves the table."""
    doc = tmp_path / "b.md"
    gone = "| gone | g | 1 | 1 | **PASS** | 2026-11-25 09:00 UTC |"
    doc.write_text(f"{report.BEGIN}\n- 2026-11-25 09:00 UTC: gone; old\n\n{gone}\n{report.END}\n")
    two_gpus = [
        _result("split", judged("iw", 1.05, True, "1.050", "<= 1.1"), judged("step", 0.95, True, "0.950", "< 1")),
        _result("nccl", failed("losses", "exit 1: a | b\nTraceback", "within 1e-05")),
    ]
    report.update_doc(doc, FACTS, two_gpus, "2026-11-25 10:00:00 UTC", tmp_path / "a")
    one_gpu = [_result("split", judged("iw", 0.99, True, "0.990", "<= 1.1"), skipped("step", "one rank", "< 1"))]
    report.update_doc(doc, FACTS, one_gpu, "2026-11-25 10:00:30 UTC", tmp_path / "b")
    rows = [line for line in doc.read_text().splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows == [
        "| nccl | losses | exit 1: a \\| b Traceback | within 1e-05 | **FAIL** | 2026-11-25 10:00:00 UTC |",
        "| split | iw | 0.990 | <= 1.1 | **PASS** | 2026-11-25 10:00:30 UTC |",
        "| split | step | 0.950 | < 1 | **PASS** | 2026-11-25 10:00:00 UTC |",
    ]
    reports = [line.split(";")[0] for line in doc.read_text().splitlines() if line.startswith("- ")]
    assert reports == ["- 2026-11-25 10:00:30 UTC: split", "- 2026-11-25 10:00:00 UTC: split, nccl"]


def test_the_command_line_help_names_every_check():
    from ppx.cli import parser

    gpu_check = parser()._subparsers._group_actions[0].choices["gpu-check"]
    (only,) = [a for a in gpu_check._actions if "--only" in a.option_strings]
    assert [c.NAME for c in CHECKS if c.NAME not in only.help] == []


@pytest.mark.parametrize("gpus", ["0", "-2"])
def test_a_dry_run_of_no_gpus_is_one_line(capsys, gpus):
    from ppx.cli import main

    assert main(["gpu-check", "--dry-run", "--gpus", gpus]) == 2
    assert capsys.readouterr().err.strip() == f"ppx: error: --gpus must be at least 1, got {gpus}"
