"""A new user's first commands, as a review found them: each slip answered in one line
``ppx: error: ...`` (exit 2) that names what was given, before any work, and lines that say
what happened as it is."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from helpers import DATA, REPO, ppx


def test_compare_refuses_a_path_that_is_no_run_nor_holds_one(tmp_path):
    """`ppx compare docs README.md <run>` compared the one run and said nothing of the others."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# mine\n")
    run = tmp_path / "runs" / "gpipe_2cpu" / "20260101-000000"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    for given, first in ((["docs", "README.md"], "docs"), (["README.md"], "README.md")):
        r = ppx("compare", *given, str(run.relative_to(tmp_path)), "--out", "cmp", cwd=tmp_path, timeout=60)
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert r.stderr == f"ppx: error: {first} is neither a run (a folder with summary.json) nor a folder of runs\n"
        assert not (tmp_path / "cmp").exists()
    # ppx's own comparisons (runs/compare, in a shell's runs/*) are passed over, named or matched
    (tmp_path / "runs" / "compare" / "20260101-000001").mkdir(parents=True)
    (tmp_path / "runs" / "compare" / "20260101-000001" / "compare.json").write_text("{}")
    r = ppx("compare", "runs/compare", "README.md", "--out", "cmp", cwd=tmp_path, timeout=60)
    assert r.stderr == "ppx: error: README.md is neither a run (a folder with summary.json) nor a folder of runs\n"
    # a glob's matches that are no runs are passed over, as before (a glob picks the runs of a folder)
    r = ppx("compare", "READ*", "doc[s]", "--out", "cmp", cwd=tmp_path, timeout=60)
    assert (r.returncode, r.stderr) == (2, "ppx: error: no completed run (summary.json) under READ* doc[s]\n")


def test_python_m_ppx_is_the_ppx_command(tmp_path):
    """`python -m ppx` said "No module named ppx.__main__"; it is the console script's command,
    its output and exit code, where it succeeds and where it refuses."""
    for args, code in ((["schedule", "1f1b", "-p", "2", "-m", "2"], 0), (["schedule", "zigzag"], 2)):
        ours = subprocess.run(
            [sys.executable, "-m", "ppx", *args], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        cli = ppx(*args, timeout=60)
        assert ours.returncode == code, ours.stderr
        assert (ours.returncode, ours.stdout, ours.stderr) == (cli.returncode, cli.stdout, cli.stderr)


def test_version_is_printed_without_torch(tmp_path):
    """`ppx --version` did not exist ("the following arguments are required: command")."""
    declared = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    r = ppx("--version", timeout=60, cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"ppx {declared}\n", "")
    code = (
        "import sys\nfrom ppx.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit as e:\n"
        "    assert 'torch' not in sys.modules, 'torch imported'\n    raise\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"ppx {declared}\n", "")
    # into a pipe no one reads: quietly, 141, as ppx keys | head (it printed "Exception ignored ...
    # BrokenPipeError", exit 120); output buffered, as CI's Python has it
    read, write = os.pipe()
    os.close(read)
    try:
        version = [sys.executable, "-m", "ppx", "--version"]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        r = subprocess.run(version, cwd=REPO, env=env, stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (141, "")


def test_an_experiment_path_without_its_suffix_gets_a_hint(tmp_path):
    """`ppx run experiments/1f1b_2cpu` said only "does not exist", where `ppx run
    1f1b_2cpu.yaml` named the experiment it meant."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "exp.yaml").write_text("train:\n  steps: 1\n")
    for given, hint in (
        ("mine/exp", "did you mean mine/exp.yaml?"),
        ("mine/exp/", "did you mean mine/exp.yaml?"),
        ("elsewhere/1f1b_2cpu", "did you mean the experiment 1f1b_2cpu?"),  # (a shipped experiment's name)
    ):
        r = ppx("run", given, timeout=60, cwd=tmp_path)
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert r.stderr == f"ppx: error: experiment file {given} does not exist ({hint})\n"
    r = ppx("run", "elsewhere/nothing_known", timeout=60, cwd=tmp_path)
    assert r.stderr == "ppx: error: experiment file elsewhere/nothing_known does not exist\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_a_bad_cost_flag_is_quoted_as_typed(tmp_path):
    """`ppx simulate --fwd-ms -1` said "got [-1.0, -1.0, -1.0, -1.0]": the value expanded to
    every stage, not the one typed."""
    for args, said in (
        (["simulate", "1f1b", "--fwd-ms", "-1"], "--fwd-ms must not be negative, got -1"),
        (["simulate", "1f1b", "-p", "2", "--bwd-ms", "1,-2.50"], "--bwd-ms must not be negative, got 1,-2.50"),
        (["simulate", "1f1b", "--wgrad-ms", "1e13"], "--wgrad-ms must be at most 1e+12 ms (about 30 years), got 1e13"),
        (["plan", "--fwd-ms", "-1", "--bwd-ms", "2"], "--fwd-ms must not be negative, got -1"),
    ):
        r = ppx(*args, timeout=60, cwd=tmp_path)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", f"ppx: error: {said}\n")
    assert list(tmp_path.iterdir()) == []


def test_a_budget_without_a_unit_under_1kib_is_refused(tmp_path):
    """`ppx plan --mem-budget 40` was read as 40 bytes: the plan was made, then "nothing fits
    --mem-budget 40 per rank" (exit 1)."""
    costs = ["plan", "--fwd-ms", "10", "--bwd-ms", "20", "--act-bytes", "100", "--schedules", "1f1b", "-m", "8"]
    r = ppx(*costs, "--mem-budget", "40", timeout=120, cwd=tmp_path)
    said = "--mem-budget 40: a size without a unit is bytes, and 40 bytes holds nothing; give a size with its unit (e.g. --mem-budget 40GiB)"
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"ppx: error: {said}\n")
    assert list(tmp_path.iterdir()) == []
    # a bare number from 1 KiB up is bytes, as before; a unit says bytes in as few
    for budget in ("2048", "40B"):
        r = ppx(*costs, "--mem-budget", budget, "--out", str(tmp_path / budget), timeout=120, cwd=tmp_path)
        assert r.returncode == (0 if budget == "2048" else 1), r.stderr
        assert "without a unit" not in r.stderr


def test_a_sweep_names_a_point_only_for_an_error_of_its_values(tmp_path):
    """`ppx sweep nosuch --sweep pipeline.microbatches=2,4` said "sweep point
    pipeline.microbatches=2: unknown experiment ...": an error of every point blamed on the first."""
    for args, said in (
        (["nosuch", "--sweep", "pipeline.microbatches=2,4"], "unknown experiment 'nosuch'; choose from "),
        (["nosuch", "--repeat", "2"], "unknown experiment 'nosuch'; choose from "),  # (was "sweep point : ...")
        (
            ["gpipe_2cpu", "--sweep", "pipeline.microbatches=2,4", "pipeline.stagse=3"],
            "pipeline.stagse: Key 'stagse' not in 'PipelineConfig'. Did you mean: 'stages'?",
        ),
        (  # the experiment's batch and the fixed override's m: no point's values
            ["gpipe_2cpu", "--sweep", "model.hidden=8,16", "pipeline.microbatches=3"],
            "train.batch_size=32 is not divisible by pipeline.microbatches=3",
        ),
        # an error that a point's values cause names the point, one point of one or of several
        (
            ["gpipe_2cpu", "--sweep", "pipeline.microbatches=3"],
            "sweep point pipeline.microbatches=3: train.batch_size=",
        ),
        (
            ["gpipe_2cpu", "--sweep", "pipeline.microbatches=2,3 model.hidden=8,16"],
            "sweep point pipeline.microbatches=3 model.hidden=8: train.batch_size=32 is not divisible",
        ),
    ):
        r = ppx("sweep", *args, timeout=60, cwd=tmp_path)
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert r.stderr.startswith(f"ppx: error: {said}") and r.stderr.count("\n") == 1, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_runs_config_run_again_from_elsewhere_names_the_csv_copy_the_run_kept(tmp_path):
    """A run's config.yaml holds its schedule CSV's path as typed, relative to the folder it ran
    from; run again from another folder, the line names the copy the run kept (it said only that
    the CSV could not be read), and that copy runs."""
    first = tmp_path / "first"
    (first / "orders").mkdir(parents=True)
    (first / "orders" / "mine.csv").write_text((DATA / "1f1b_p2_m4.csv").read_text())
    run = tmp_path / "run"
    quick = ["train.steps=1", "model.hidden=16"]
    r = ppx("run", "1f1b_2cpu", "pipeline.schedule=orders/mine.csv", *quick, f"run.dir={run}", cwd=first)
    assert r.returncode == 0, r.stderr[-2000:]
    kept = run / "schedules" / "mine.csv"
    r = ppx("run", str(run / "config.yaml"), timeout=60, cwd=tmp_path)
    assert (r.returncode, r.stderr) == (
        2,
        "ppx: error: cannot read schedule CSV orders/mine.csv: No such file or directory (the run of "
        f"{run / 'config.yaml'} kept a copy: pipeline.schedule={kept})\n",
    )
    again = ["run.dir=null", f"run.root={tmp_path / 'again'}"]
    r = ppx("run", str(run / "config.yaml"), f"pipeline.schedule={kept}", *again, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_run_dir_that_is_a_file_is_said_so(tmp_path):
    (tmp_path / "afile").write_text("mine")
    r = ppx("run", "gpipe_2cpu", f"run.dir={tmp_path / 'afile'}", timeout=60)
    assert (r.returncode, r.stderr) == (
        2,
        f"ppx: error: run.dir={tmp_path / 'afile'}: {tmp_path / 'afile'} is a file, not a run directory; give a new "
        "folder's path\n",
    )
    assert (tmp_path / "afile").read_text() == "mine"


def test_existing_run_directory_is_never_overwritten(tmp_path):
    d = tmp_path / "taken"
    d.mkdir()
    (d / "summary.json").write_text("precious")
    # (gpipe_4gpu: where it would fall back to CPU, the refusal comes before the fallback's notice)
    for experiment in ("gpipe_2cpu", "gpipe_4gpu"):
        r = ppx("run", experiment, f"run.dir={d}", timeout=60)
        assert r.returncode == 2
        assert r.stderr.strip() == (
            f"ppx: error: run directory {d} already exists; ppx never overwrites a run: give another run.dir, or "
            "run.dir=null for a new run under run.root"
        )
        assert (d / "summary.json").read_text() == "precious" and len(list(d.iterdir())) == 1


def test_a_key_only_another_model_kind_reads_is_noted(tmp_path):
    """`ppx run 1f1b_2cpu model.hf_config=llama` trained the MLP without a word (model.kind=hf
    left out): the run goes on, its note names the key, the kind that reads it and the run's."""
    r = ppx("run", "1f1b_2cpu", "model.hf_config=llama", "train.steps=1", f"run.dir={tmp_path / 'run'}")
    assert r.returncode == 0, r.stderr[-2000:]
    note = "ppx: note: model.hf_config=llama (model.kind=hf's) changes nothing here: this run's model.kind is mlp\n"
    assert note in r.stderr and "changes nothing" not in r.stderr.replace(note, "")


def test_a_tracer_split_stage_says_why_it_stores_nothing(tmp_path):
    """Under pipeline.split=tracer a stage keeps its graph: it said "no Linear layers to store"
    of a model made of Linear layers (the tracer's GraphModules hold their weights only)."""
    r = ppx(
        "run",
        "1f1b_2cpu",
        "pipeline.split=tracer",
        "pipeline.schedule=zb_h1",
        "train.steps=1",
        f"run.dir={tmp_path / 'r'}",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    why = "pipeline.split=tracer's GraphModules hold the Linear layers' weights, not the layers: nothing to store"
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["split_backward"]["1"] == {
        "mode": "graph",
        "why": why,
    }
    assert f"stage 1 graph ({why})" in r.stdout


def test_compare_prints_its_table_alone_when_asked(tmp_path):
    """`ppx compare` wrote a new folder of about 5 MB (report.html, pictures) for a table one
    wanted to read: `--print-only` prints the table and writes nothing."""
    r = ppx("run", "1f1b_2cpu", "train.steps=1", "model.hidden=16", f"run.dir={tmp_path / 'one'}")
    assert r.returncode == 0, r.stderr[-2000:]
    written = ppx("compare", "one", "--out", "cmp", cwd=tmp_path, timeout=120)
    assert written.returncode == 0, written.stderr[-2000:]
    printed = ppx("compare", "one", "--print-only", cwd=tmp_path, timeout=120)
    assert (printed.returncode, printed.stderr) == (0, "")
    assert printed.stdout.splitlines()[:3] == written.stdout.splitlines()[:3]  # (the header, the run's row)
    assert printed.stdout.splitlines()[2].startswith("one  ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp", "one"]  # (no runs/compare)
    both = ppx("compare", "one", "--print-only", "--out", "x", cwd=tmp_path, timeout=60)
    assert (both.returncode, both.stderr) == (2, "ppx: error: --print-only writes nothing: leave out --out\n")
