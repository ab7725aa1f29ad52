"""`ppx split`: a config's split of its model over the stages, before any run, as the run
then runs it (summary.json's units_per_stage)."""

from __future__ import annotations

from helpers import REPO, ppx, read_json


def test_the_split_printed_is_the_one_a_run_runs(tmp_path):
    """llama-tiny, 8 blocks, under ZB-V: stages 0 and 3 on rank 0 (the V), 3, 2, 2, 3 units by
    FLOPs (the embedding and the head ride with a block more), and what balance=units would do."""
    args = ["llama_tiny_1f1b_2cpu", "pipeline.schedule=zbv", "model.layers=8"]
    r = ppx("split", *args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "llama_tiny_1f1b_2cpu: 10 units over 4 stages on 2 ranks"
    assert lines[2].split() == ["0", "0", "24%", "embedding", "..", "block", "1", "(3)"]
    assert lines[5].split() == ["3", "0", "28%", "block", "6", "..", "head", "(3)"]
    assert lines[6].startswith("units per stage 3, 2, 2, 3 (split by forward FLOPs, pipeline.balance=flops)")
    assert lines[7].startswith("pipeline.balance=units would split 3, 3, 2, 2: forward FLOPs per stage 24%, 36%")
    run = ppx("run", *args, "train.steps=1", f"run.dir={tmp_path / 'run'}")
    assert run.returncode == 0, run.stderr
    assert read_json(tmp_path / "run" / "summary.json")["units_per_stage"] == [3, 2, 2, 3]


def test_alike_units_and_bad_input():
    r = ppx("split", "1f1b_2cpu")
    last = "units per stage 2, 2: split evenly (pipeline.balance weighs the units of llama, hf and module models only)"
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == last
    r = ppx("split", "1f1b_2cpu", "pipeline.layers_per_stage=[3,1]")  # (no one's evening: said as given)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "units per stage 3, 1: as pipeline.layers_per_stage gives"
    # a module whose units cannot be counted (its last reads values, which meta tensors have not)
    own = ["model.kind=module", "model.data=regression", "model.module=helpers.own_module:reads_values_last"]
    r = ppx("split", "1f1b_2cpu", *own, "model.layers=3", "model.hidden=16", env={"PYTHONPATH": str(REPO / "tests")})
    said = "units per stage 2, 1: split evenly (no unit's forward FLOPs counted: a unit that cannot run on the meta "
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == said + "device, or no matmul)", r.stdout + r.stderr
    bad = ppx("split", "llama_tiny_1f1b_2cpu", "pipeline.balance=even")
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.splitlines()) == 1
    assert bad.stderr.startswith("ppx: error: ") and "pipeline.balance" in bad.stderr


def test_a_file_of_no_yaml_keys_is_named_with_its_first_problem_cut_short(tmp_path):
    """/etc/passwd's lines read as one key: its whole text was the error line, twice."""
    lines = [f"user{k}:x:{k}:{k}:User {k}:/home/user{k}:/bin/sh" for k in range(40)]  # (one YAML key of them all)
    (tmp_path / "passwd").write_text("\n".join(lines) + "\n")
    r = ppx("split", str(tmp_path / "passwd"))
    key = " ".join(lines)  # (YAML folds the lines into one)
    said = (
        f"ppx: error: {tmp_path / 'passwd'}: Key '{key[:45]}...{key[-32:]}' ({len(key)} characters) not in 'Config'\n"
    )
    assert (r.returncode, r.stdout, r.stderr) == (2, "", said)
    typo = "x" * 90 + "_hiddn"  # a long key's end, where a typo mostly is, stays
    r = ppx("split", "1f1b_2cpu", f"model.{typo}=1")
    said = f"Key '{typo[:45]}...{typo[-32:]}' (96 characters) not in 'ModelConfig'"
    assert r.returncode == 2 and r.stderr.endswith(f"{typo[-32:]} (102 characters): {said}\n"), r.stderr


def test_a_model_of_changing_shapes_shows_what_each_stage_receives():
    """A CNN of your own under ZB-V in bf16: each stage but the first receives the feature maps
    the unit before it hands on, in the compute dtype; a split that would begin a stage with
    integers is refused in one line."""
    tests = {"PYTHONPATH": str(REPO / "tests")}
    cnn = ["model.kind=module", "model.module=helpers.own_shapes:convnet", "model.batch_fn=helpers.own_shapes:images"]
    r = ppx("split", "1f1b_2cpu", *cnn, "pipeline.schedule=zbv", "train.dtype=bf16", env=tests)
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()[2:6]
    assert rows[0].split() == ["0", "0", "33%", "0"], rows
    assert rows[1].endswith("1; receives (8, 8, 8, 8) bfloat16, 8.0 KiB a microbatch"), rows
    assert rows[3].endswith("3; receives (8, 16, 2, 2) bfloat16, 1.0 KiB a microbatch"), rows
    bins = [
        "model.kind=module",
        "model.module=helpers.own_shapes:quantized",
        "model.data=regression",
        "model.hidden=16",
    ]
    bad = ppx("split", "1f1b_2cpu", *bins, "pipeline.layers_per_stage=[1,3]", env=tests)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
    assert "stage 1 would begin at unit 1, handed int64 (shape (8, 16)) by unit 0" in bad.stderr
