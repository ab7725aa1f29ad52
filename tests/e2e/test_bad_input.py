"""Bad input: one clear line on stderr, a non-zero exit, no process group, no run directory."""

from __future__ import annotations

import json

import pytest

from helpers import DATA, PICTURED_1F1B, ppx, torchrun_ppx

CASES = {
    "unknown key": (["gpipe_2cpu", "pipeline.stagse=4"], "Did you mean: 'stages'?"),
    "unknown section": (["gpipe_2cpu", "pipelin.stages=4"], "Did you mean: 'pipeline'?"),
    "wrong type": (["gpipe_2cpu", "pipeline.stages=four"], "pipeline.stages: Value 'four'"),
    "unknown schedule": (
        ["gpipe_2cpu", "pipeline.schedule=zigzag"],
        "unknown schedule 'zigzag'; choose from naive, gpipe, 1f1b, forward_only",
    ),
    "batch not divisible": (
        ["gpipe_2cpu", "train.batch_size=30", "pipeline.microbatches=4"],
        "train.batch_size=30 is not divisible by pipeline.microbatches=4",
    ),
    "more stages than layers": (["gpipe_2cpu", "pipeline.stages=8", "model.layers=4"], "8 stages but model.layers=4"),
    "bad split": (["gpipe_2cpu", "pipeline.layers_per_stage=[3,3]"], "must be positive and sum to model.layers=4"),
    "unknown model": (["gpipe_2cpu", "model.kind=rnn"], "model.kind: Invalid value 'rnn'"),
    "unknown experiment": (["no_such_experiment"], "unknown experiment 'no_such_experiment'; choose from"),
    "malformed override": (["gpipe_2cpu", "pipeline.stages"], "override 'pipeline.stages' must look like key=value"),
    "override without a key": (["gpipe_2cpu", "=3"], "override '=3' must look like key=value"),
    "bad fault spec": (["gpipe_2cpu", "runtime.inject_fault=explode"], "must look like hang@<action>"),
    "untraceable model": (
        ["gpipe_2cpu", "model.kind=synthetic", "pipeline.split=tracer"],
        "pipeline.split=tracer cannot trace model.kind=synthetic",
    ),
    "unknown executor": (["gpipe_2cpu", "pipeline.executor=deepspeed"], "pipeline.executor: Invalid value 'deepspeed'"),
    "stores under torch's executor": (
        ["1f1b_2cpu", "pipeline.schedule=zb_h1", "pipeline.executor=torch", "train.split_backward=store"],
        "train.split_backward=store cannot run here: torch's executor splits its backward its own way",
    ),
    "stores without Linear layers": (
        ["1f1b_2cpu", "pipeline.schedule=zbv", "model.kind=synthetic", "train.split_backward=store"],
        "train.split_backward=store cannot run here: the known-cost model has no Linear layers",
    ),
    "profile window past the run": (
        ["gpipe_2cpu", "profile.enabled=true", "train.steps=3"],
        "profile.enabled: the profiler records steps 2..3",
    ),
    "fault on an action the schedule lacks": (
        ["gpipe_2cpu", "runtime.inject_fault=hang@1F9"],
        "1F9 is not an action of this gpipe schedule (2 stages, 4 microbatches)",
    ),
    "run name that is a path": (
        ["gpipe_2cpu", "run.name=../../escape"],
        "run.name='../../escape' must be a plain folder name",
    ),
    "empty batch": (["gpipe_2cpu", "train.batch_size=0"], "train.batch_size must be >= 1, got 0"),
    "no replicas": (["gpipe_2cpu", "parallel.data=0"], "parallel.data must be >= 1, got 0"),
    "global batch that does not split over the replicas": (
        ["gpipe_2cpu", "parallel.data=3"],
        "train.batch_size=32 (the global batch) does not split into parallel.data=3 replicas x pipeline.microbatches=4",
    ),
    "unknown key in the CPU fallback, even where it does not apply": (
        ["gpipe_2cpu", "runtime.cpu_fallback=[model.presett=llama-tiny]"],
        "runtime.cpu_fallback: model.presett: Key 'presett' not in 'ModelConfig'. Did you mean: 'preset'?",
    ),
    "sharding without replicas": (["gpipe_2cpu", "parallel.data_shard=true"], "it needs parallel.data > 1"),
    "a paired entry that is no string": (
        ["gpipe_2cpu", "run.paired=[{a: 1}]"],
        "run.paired: {'a': 1} is not a string of key=value overrides",
    ),
    "replicas on torch's executor": (
        ["gpipe_2cpu", "parallel.data=2", "pipeline.executor=torch"],
        "parallel.data=2 runs on ppx's executor",
    ),
    "unwritable run root": (
        ["gpipe_2cpu", "run.root=/proc/ppx-cannot-be-here"],
        "run.root=/proc/ppx-cannot-be-here: cannot create /proc/ppx-cannot-be-here/gpipe_2cpu (",
    ),
    "unwritable run dir": (
        ["gpipe_2cpu", "run.dir=/proc/ppx-cannot-be-here/x"],
        "run.dir=/proc/ppx-cannot-be-here/x: ",
    ),
    "cuda without gpus": (["gpipe_2cpu", "runtime.device=cuda"], "runtime.device=cuda needs 2 GPUs"),
    "negative learning rate": (["gpipe_2cpu", "train.lr=-1"], "train.lr must be a finite number >= 0, got -1.0"),
    "no attention heads": (["transformer_1f1b_2cpu", "model.heads=0"], "model.heads and model.ffn_mult must be >= 1"),
    "negative attention heads": (
        ["transformer_1f1b_2cpu", "model.heads=-4"],
        "model.heads and model.ffn_mult must be >= 1",
    ),
    "cost that is not a number, any model": (
        ["gpipe_2cpu", "model.fwd_ms=abc"],
        "model.fwd_ms must be a number of milliseconds",
    ),
    "empty experiment name": (["", "train.steps=1"], "the experiment is empty: give its name"),
    "timeout under a second": (["gpipe_2cpu", "runtime.timeout_s=0.05"], "runtime.timeout_s must be seconds from 1 to"),
    "timeout that is not a number": (["gpipe_2cpu", "runtime.timeout_s=nan"], "timeout_s must be seconds from 1"),
    "endless timeout": (["gpipe_2cpu", "runtime.timeout_s=inf"], "from 1 to 1e+09, got inf"),
    "heads not dividing hidden": (
        ["transformer_1f1b_2cpu", "model.hidden=30"],
        "model.hidden=30 is not divisible by model.heads",
    ),
    "no timeline steps": (["gpipe_2cpu", "instrument.timeline_steps=0"], "instrument.timeline_steps must be >= 1"),
    "negative memory steps": (["gpipe_2cpu", "instrument.memory_steps=-1"], "instrument.memory_steps must be >= 0"),
    "negative progress interval": (["gpipe_2cpu", "logging.progress_every=-1"], "logging.progress_every must be >= 0"),
    "paired config changing the job": (
        ["1f1b_2cpu", "run.paired=[pipeline.stages=4]"],
        "run.paired: pipeline.stages cannot change beside the run",
    ),
    "paired config with an unknown key": (
        ["1f1b_2cpu", "run.paired=[pipeline.schedule=zb_h1 pipeline.stagse=2]"],
        "run.paired: 'pipeline.schedule=zb_h1 pipeline.stagse=2': pipeline.stagse: Key 'stagse' not in",
    ),
    "paired config its rules refuse": (
        ["1f1b_2cpu", "run.paired=[pipeline.schedule=zigzag]"],
        "run.paired: 'pipeline.schedule=zigzag': unknown schedule 'zigzag'",
    ),
    "paired config on torch's runtime": (
        ["1f1b_2cpu", "run.paired=[pipeline.schedule=torch_1f1b]"],
        "run.paired: 'pipeline.schedule=torch_1f1b' runs on torch's runtime; an entry runs on ppx's",
    ),
    "paired config changing a module's loss": (
        ["examples/tiny_gpt.yaml", "run.paired=[model.data=regression]"],
        "run.paired: 'model.data=regression' changes model.* beside a model.kind=module run",
    ),
    "paired config given twice": (
        ["1f1b_2cpu", "run.paired=[pipeline.schedule=gpipe,pipeline.schedule=gpipe]"],
        "run.paired: 'pipeline.schedule=gpipe' is given twice",
    ),
    "paired config given twice, spelled otherwise": (
        ["1f1b_2cpu", 'run.paired=["pipeline.schedule=gpipe train.lr=0.1","train.lr=0.1 pipeline.schedule=gpipe"]'],
        "run.paired: 'train.lr=0.1 pipeline.schedule=gpipe' is the same config as 'pipeline.schedule=gpipe train.lr=0.1'",
    ),
    "paired floors given twice": (
        ["1f1b_2cpu", "run.paired=[pipeline.schedule=1f1b,pipeline.microbatches=4]"],
        "run.paired: 'pipeline.microbatches=4' is the same config as 'pipeline.schedule=1f1b'",
    ),
    "paired config with an unquoted list value": (
        ["1f1b_2cpu", "run.paired=[pipeline.layers_per_stage=[2,2]]"],
        """its value is not YAML: did not find expected ',' or ']' (while parsing a flow sequence) (quote an entry whose value holds brackets: 'run.paired=["pipeline.layers_per_stage=[2,2]"]')""",
    ),
    "paired config with spaces around its =": (
        ["1f1b_2cpu", "run.paired=[pipeline.schedule = gpipe]"],
        "an entry's overrides are split at spaces: no space around '='",
    ),
    "paired config setting a key twice": (
        ["1f1b_2cpu", 'run.paired=["train.lr=0.1 train.lr=0.003"]'],
        "run.paired: 'train.lr=0.1 train.lr=0.003' sets train.lr twice",
    ),
    "paired configs beside replicas": (
        ["1f1b_2cpu", "parallel.data=2", "run.paired=[pipeline.schedule=gpipe]"],
        "run.paired runs beside one pipeline: parallel.data must be 1",
    ),
    # your own model (model.kind=hf, module): two through the command; the rest in
    # tests/unit/test_own_model_errors.py
    "hf architecture ppx cannot split": (
        ["1f1b_2cpu", "model.kind=hf", "model.hf_config=mamba"],
        "ppx cannot split MambaForCausalLM: parts it has beyond embedding, layers and final norm: norm_f",
    ),
    "module that does not import": (
        ["examples/tiny_gpt.yaml", "model.module=no_such_package:build"],
        "model.module=no_such_package:build: cannot import no_such_package: ModuleNotFoundError",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_fast_with_one_line(case, tmp_path):
    args, expected = CASES[case]
    # "cuda without gpus" holds on any machine: the tests' runs see no GPU (helpers/gpus.py)
    root = [] if any(a.startswith("run.root=") for a in args) else [f"run.root={tmp_path}"]
    r = ppx("run", *args, *root, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ppx: error: ") and expected in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []  # no run directory left behind
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_a_run_directory_under_a_file_or_an_experiment_file_named_wrongly_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("")
    r = ppx("run", "gpipe_2cpu", f"run.dir={tmp_path / 'afile' / 'a' / 'b'}", timeout=60)
    assert r.returncode == 2
    assert (
        r.stderr.strip()
        == f"ppx: error: run.dir={tmp_path / 'afile' / 'a' / 'b'}: {tmp_path / 'afile'} is a file, not a folder"
    )
    r = ppx("run", "gpipe_2cpu.yaml", f"run.root={tmp_path}", timeout=60)
    assert r.returncode == 2 and r.stderr.strip().endswith("(did you mean the experiment gpipe_2cpu?)")
    r = ppx("simulate", "1f1b", "--from-run", str(tmp_path / "afile"), timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == f"ppx: error: {tmp_path / 'afile'} is not a run directory (a file)"


def test_a_sweep_under_a_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("")
    r = ppx("sweep", "gpipe_2cpu", "--sweep", "pipeline.microbatches=2,4", f"run.root={tmp_path / 'afile'}", timeout=60)
    assert r.returncode == 2
    assert (
        r.stderr.strip() == f"ppx: error: run.root={tmp_path / 'afile'}: {tmp_path / 'afile'} is a file, not a folder"
    )


def test_stages_not_matching_the_process_count(tmp_path):
    """Started by torchrun with 2 processes for a 4-stage experiment: rank 0 says so in one
    line and every rank exits before any process group starts."""
    r = torchrun_ppx(2, "run", "gpipe_4gpu", f"run.root={tmp_path}", timeout=120)
    assert r.returncode != 0
    ours = [line for line in r.stderr.splitlines() if line.startswith("ppx: error:")]
    assert ours == [
        "ppx: error: pipeline.stages=4 but this job has 2 processes (WORLD_SIZE); start one process per stage"
    ]
    assert list(tmp_path.iterdir()) == []


OTHER_COMMANDS = {
    "simulate: not a number": (["simulate", "1f1b", "-p", "2", "--fwd-ms", "abc"], "--fwd-ms abc: give milliseconds"),
    "simulate: negative latency": (["simulate", "1f1b", "--p2p-ms", "-1"], "--p2p-ms must be >= 0"),
    "simulate: nan ms": (["simulate", "1f1b", "--fwd-ms", "nan"], "--fwd-ms must be finite milliseconds"),
    "simulate: costs for 3 stages of 2": (
        ["simulate", "1f1b", "-p", "2", "--fwd-ms", "10,12,14"],
        "one number or 2 numbers",
    ),
    "simulate: lookahead": (["simulate", "1f1b", "--recv-lookahead", "-3"], "--recv-lookahead must be -1"),
    "simulate: png into a missing folder": (
        ["simulate", "1f1b", "--png", "/nonexistent-ppx/x.png"],
        "folder /nonexistent-ppx does not exist",
    ),
    "schedule: csv into a missing folder": (
        ["schedule", "1f1b", "--csv", "/nonexistent-ppx/x.csv"],
        "folder /nonexistent-ppx does not exist",
    ),
    "schedule: zero-slot forward": (["schedule", "1f1b", "--fwd", "0"], "--fwd and --bwd must be >= 1 grid slot"),
    "simulate: zero ranks": (
        ["simulate", "1f1b", "-p", "0"],
        "stages (0), microbatches (8) and virtual stages (1) must be >= 1",
    ),
    "simulate: zero microbatches": (["simulate", "1f1b", "-m", "0"], "microbatches (0)"),
    "simulate: a picture into a folder": (
        ["simulate", "1f1b", "--png", "/tmp"],
        "--png /tmp is a folder; give a file's path",
    ),
    "schedule: a CSV into a folder": (
        ["schedule", "1f1b", "--csv", "/tmp"],
        "--csv /tmp is a folder; give a file's path",
    ),
    "schedule: a list too big to build": (
        ["schedule", "1f1b", "-p", "100000", "-m", "100000"],
        "100000 ranks x 1 stages x 100000 microbatches = 10000000000 stage-microbatches: ppx builds lists of at most",
    ),
    "schedule: a shape rule names the options typed": (
        ["schedule", "zbv", "-p", "2", "-m", "8", "-v", "3"],
        "in a V (stage s on rank s, then on rank 2p-1-s): --virtual (-v) must be 2 or left out (got 3)",
    ),
    "split: far more stages than layers": (
        ["split", "1f1b_2cpu", "pipeline.stages=100000"],
        "100000 stages but model.layers=4: every stage needs at least one layer",
    ),
    "schedule: a CSV's shape overridden": (
        ["schedule", str(DATA / "1f1b_p2_m4.csv"), "-m", "8"],
        "1f1b_p2_m4.csv is a schedule for 2 ranks, placing 1 stage on each rank, and 4 microbatches; --microbatches 8",
    ),
    "schedule: comms without a CSV": (["schedule", "1f1b", "--with-comms"], "--with-comms only shapes the --csv file"),
    "sweep: --sweep twice": (
        ["sweep", "gpipe_2cpu", "--sweep", "pipeline.schedule=gpipe,1f1b", "--sweep", "pipeline.microbatches=2,4"],
        '--sweep given 2 times; give every key in one: --sweep "pipeline.schedule=gpipe,1f1b pipeline.microbatches=2,4"',
    ),
    "sweep: a key twice": (
        ["sweep", "gpipe_2cpu", "--sweep", "pipeline.microbatches=2 pipeline.microbatches=8"],
        "sweep key pipeline.microbatches is given twice",
    ),
    "sweep: a key swept and fixed": (
        ["sweep", "gpipe_2cpu", "--sweep", "pipeline.microbatches=2,4", "pipeline.microbatches=8"],
        "pipeline.microbatches is swept and also given as an override; give it in --sweep only",
    ),
    "sweep: a value twice": (
        ["sweep", "gpipe_2cpu", "--sweep", "pipeline.microbatches=4,4"],
        "two sweep points would share the run folder 'microbatches=4'",
    ),
    "sweep: nothing to sweep": (
        ["sweep", "gpipe_2cpu"],
        'give --sweep "key=v1,v2 ...", or --repeat N to run one config N times',
    ),
    "sweep: no repeat": (
        ["sweep", "gpipe_2cpu", "--sweep", "pipeline.microbatches=2,4", "--repeat", "0"],
        "--repeat 0: give 1 or more runs of each point",
    ),
    "fault on a comm action": (
        ["run", "gpipe_2cpu", "runtime.inject_fault=die@0SEND_F1"],
        "faults fire on compute actions",
    ),
    "sweep: a point that cannot run": (
        ["sweep", "gpipe_2cpu", "--sweep", "pipeline.microbatches=4,3 pipeline.schedule=gpipe,1f1b"],
        "sweep point pipeline.microbatches=3 pipeline.schedule=gpipe: train.batch_size=",
    ),
    "sweep: one run directory": (
        ["sweep", "gpipe_2cpu", "--sweep", "pipeline.microbatches=2,4", "run.dir=/tmp/x"],
        "run.dir names one run",
    ),
}


@pytest.mark.parametrize("case", list(OTHER_COMMANDS))
def test_other_commands_fail_fast_with_one_line(case, tmp_path):
    args, expected = OTHER_COMMANDS[case]
    r = ppx(*args, timeout=60, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and r.stderr.startswith("ppx: error: "), r.stderr
    assert expected in r.stderr and r.stdout == "", r.stderr
    assert list(tmp_path.iterdir()) == []


def test_simulate_from_a_run_takes_its_shape(shared_run):
    run = shared_run(*PICTURED_1F1B).dir  # read only: shared with other files
    r = ppx("simulate", "1f1b", "--from-run", str(run))
    assert r.returncode == 0 and "1f1b: 2 ranks, 2 stages, 4 microbatches" in r.stdout, r.stdout + r.stderr
    s = json.loads((run / "summary.json").read_text())  # held against the steps its costs come from
    assert (
        f"step {s['measured_step_time_s'] * 1e3:.2f} ms" in r.stdout
        and f"bubble {s['measured_bubble_fraction']:.1%}" in r.stdout
    )
    r = ppx("simulate", "1f1b", "-p", "4", "--from-run", str(run))
    assert r.returncode == 2 and "its costs are per stage" in r.stderr
    r = ppx("simulate", str(DATA / "1f1b_p2_m4.csv"), "--from-run", str(run))  # the CSV's shape
    assert r.returncode == 0 and "1f1b_p2_m4: 2 ranks, 2 stages, 4 microbatches" in r.stdout, r.stdout + r.stderr
    assert "against the prediction" in r.stdout  # the order the run ran
    # the means' step, named as such, and beside it ppx run's own (drawn) prediction
    assert "(idle / step time, from the run's mean action costs)" in r.stdout
    assert (
        f"ppx run's own prediction draws each action's cost from its samples: step {s['predicted']['step_time_s'] * 1e3:.2f} ms"
        in r.stdout
    )
    for other in (["gpipe"], ["1f1b", "-m", "8"]):  # the run's costs in another order: its step is not this one's
        r = ppx("simulate", *other, "--from-run", str(run))
        assert r.returncode == 0 and "against the prediction" not in r.stdout, r.stdout + r.stderr
        assert f"measured in {run} (1f1b at m=4, another order than this one's): step" in r.stdout
    assert "a rank, as" not in r.stdout  # the run's stages per rank are these schedules' own
    # a run of 3 steps kept 5 in its timeline: its costs include its first step, and it is said
    assert f"note: {run}'s costs include its first step (train.steps=3, instrument.timeline_steps=5)" in r.stdout
    # interleaved takes 2 stages a rank unless told: from a run of 1 it says whose count it simulates
    r = ppx("simulate", "interleaved_1f1b", "--from-run", str(run))
    assert r.returncode == 0 and "interleaved_1f1b: 2 ranks, 2 stages, 4 microbatches" in r.stdout, r.stderr
    assert "note: interleaved_1f1b at 1 stage a rank, as" in r.stdout and "virtual_stages=2" in r.stdout
    # ZB-V places exactly 2 a rank: from a run of 1, one line saying which run to make, no note before it
    r = ppx("simulate", "zbv", "--from-run", str(run))
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert "zbv places exactly 2 stages on every rank" in r.stderr and "pipeline.schedule=zbv" in r.stderr
    assert "plan --from-run this one" not in r.stderr  # (a 1F1B run never split: a plan could not regroup it for ZB-V)


def test_a_csv_run_records_its_stages_per_rank_and_simulates_from_them(tmp_path):
    """A CSV says its stages per rank, the config does not: summary.json records the CSV's, so
    `ppx simulate` of that CSV (or the schedule it came from) takes the run's costs."""
    csv = tmp_path / "zbv.csv"
    assert ppx("schedule", "zbv", "-p", "2", "-m", "4", "--csv", str(csv)).returncode == 0
    r = ppx("run", "1f1b_2cpu", f"pipeline.schedule={csv}", "train.steps=2", f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (s["stages"], s["virtual_stages"], s["world_size"]) == (4, 2, 2)
    moved = tmp_path / "elsewhere" / "zbv.csv"  # the run's CSV no longer where it ran: told by its name
    for name in (str(csv), "zbv", str(moved)):
        if name == str(moved):
            moved.parent.mkdir()
            csv.rename(moved)
        r = ppx("simulate", name, "--from-run", str(tmp_path / "run"))
        assert r.returncode == 0 and "against the prediction" in r.stdout, r.stdout + r.stderr


def test_simulate_from_a_run_without_a_timeline_says_why(tmp_path):
    """Timers on, timeline off: the bubble is measured, but no per-action costs are kept."""
    run = tmp_path / "run"
    r = ppx(
        "run",
        "gpipe_2cpu",
        "instrument.timeline=false",
        "train.steps=2",
        "logging.tensorboard=false",
        f"run.dir={run}",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((run / "summary.json").read_text())
    assert "bubble_fraction" in s and "measured_costs" not in s and not (run / "timeline.json").exists()
    assert "ppx: instrument.timeline=false: no timeline, so no measured costs or prediction" in r.stdout
    r = ppx("simulate", "gpipe", "--from-run", str(run))
    assert r.returncode == 2
    assert (
        f"ppx: error: {run} has no measured costs (run it with instrument.timers and instrument.timeline on)"
        in r.stderr
    )
