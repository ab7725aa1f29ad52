"""The config schema: layering, validation, and documentation of every key."""

from __future__ import annotations

import argparse
import os

import pytest

from helpers import REPO
from ppx import config
from ppx.commands.keys import cmd_keys
from ppx.errors import UserError


def test_layering_defaults_experiment_overrides():
    cfg = config.load("gpipe_4gpu", ["train.steps=3", "pipeline.layers_per_stage=[1,2,2,3]"])
    assert cfg.pipeline.schedule == "gpipe" and cfg.pipeline.stages == 4  # from the YAML
    assert cfg.train.steps == 3 and cfg.pipeline.layers_per_stage == [1, 2, 2, 3]  # overrides
    assert cfg.train.optimizer == "sgd" and cfg.runtime.timeout_s == 60.0  # defaults
    assert cfg.run.name == "gpipe_4gpu"


def test_a_load_leaves_the_next_loads_defaults_as_they_were(tmp_path):
    """The schema's defaults are built once and every load starts from them: no load's
    preset, experiment, overrides, fallback or file may change them for the next."""
    from ppx.config.schema import Config

    before = config.load(None, [])
    (tmp_path / "c.yaml").write_text(config.to_yaml(config.load("1f1b_2cpu", ["model.hidden=8"])))
    config.from_yaml(tmp_path / "c.yaml")
    config.load(None, ["model.hidden=12", "train.steps=9"])
    config.load("llama_tiny_1f1b_2cpu", ["train.steps=7", "runtime.cpu_fallback=[pipeline.stages=1]"])
    with pytest.raises(UserError):
        config.load("1f1b_2cpu", ["train.steps=2", "nope=1"])
    after = config.load(None, [])
    assert after == before == Config(run=before.run)  # the schema's own defaults (run.name set by load)
    assert after.train.steps == Config().train.steps and after.model.hidden == Config().model.hidden


def test_experiment_by_path_and_round_trip(tmp_path):
    exp = tmp_path / "mine.yaml"
    exp.write_text("pipeline:\n  stages: 3\nmodel:\n  layers: 6\n")
    cfg = config.load(str(exp), [])
    assert cfg.run.name == "mine" and cfg.pipeline.stages == 3
    (tmp_path / "config.yaml").write_text(config.to_yaml(cfg))
    assert config.from_yaml(tmp_path / "config.yaml") == cfg


def test_every_shipped_experiment_loads():
    names = sorted(p.stem for p in (REPO / "experiments").glob("*.yaml"))
    assert {"naive_4gpu", "gpipe_4gpu", "1f1b_4gpu", "gpipe_2cpu", "1f1b_2cpu"} <= set(names)
    for name in names:
        config.load(name, [])


def test_every_key_is_documented_in_docs_config(capsys):
    text = (REPO / "docs" / "config.md").read_text()
    for key, default, help in config.describe():
        assert help, f"{key} has no help text"
        assert f"| `{key}` | `{default}` |" in text, f"docs/config.md's key table misses {key}"
    # the table between its markers is `ppx keys --markdown` as it prints now (the command that
    # regenerates it keeps what follows the end marker: without the marker it would drop it)
    begin, end = "<!-- keys:begin (generated: ppx keys --markdown) -->\n", "<!-- keys:end -->\n"
    assert text.count(begin) == 1 and text.count(end) == 1, "docs/config.md lost a keys marker"
    cmd_keys(argparse.Namespace(markdown=True))
    assert text.split(begin)[1].split(end)[0] == capsys.readouterr().out, "regenerate docs/config.md's key table"


def test_schedule_csv_must_match_stages(tmp_path):
    from ppx import schedules

    path = tmp_path / "s.csv"
    schedules.write_csv(schedules.build("1f1b", 2, 4).compute_only(), path)
    cfg = config.load(None, [f"pipeline.schedule={path}", "pipeline.stages=2", "pipeline.microbatches=4"])
    assert cfg.pipeline.schedule == str(path)
    with pytest.raises(UserError, match="is for 2 ranks and 4 microbatches"):
        config.load(None, [f"pipeline.schedule={path}", "pipeline.stages=3"])
    # the CSV says how many stages each rank holds: a different pipeline.virtual_stages is refused
    ok = [f"pipeline.schedule={path}", "pipeline.stages=2", "pipeline.microbatches=4"]
    assert config.load(None, [*ok, "pipeline.virtual_stages=1"]).pipeline.virtual_stages == 1
    with pytest.raises(UserError, match="places 1 stage on each rank, but pipeline.virtual_stages=2"):
        config.load(None, [*ok, "pipeline.virtual_stages=2"])
    # stages held unevenly (rank 1 two of three): each rank's count said, not "1 on each rank"
    uneven = tmp_path / "uneven.csv"
    uneven.write_text("0F0,0F1,0B0,0B1\n1F0,2F0,1F1,2F1,2B0,1B0,2B1,1B1\n")
    ok = [f"pipeline.schedule={uneven}", "pipeline.stages=2", "pipeline.microbatches=2", "model.layers=3"]
    assert config.load(None, ok).pipeline.virtual_stages is None
    with pytest.raises(
        UserError, match=r"places its stages unevenly \(rank 0 1, rank 1 2\), but pipeline.virtual_stages=2"
    ):
        config.load(None, [*ok, "pipeline.virtual_stages=2"])


def test_overrides_read_back_as_their_values_and_summary_only_is_valid_config():
    from omegaconf import OmegaConf

    from ppx.config import SUMMARY_ONLY, as_overrides

    keys = {"a.b": True, "a.c": False, "d": None, "e": [1, 2], "f": 0.5, "g": "disabled"}
    assert OmegaConf.to_container(OmegaConf.from_dotlist(as_overrides(keys))) == {
        "a": {"b": True, "c": False},
        "d": None,
        "e": [1, 2],
        "f": 0.5,
        "g": "disabled",
    }
    cfg = config.load("1f1b_2cpu", as_overrides(SUMMARY_ONLY))
    assert cfg.logging.wandb.mode == "disabled" and cfg.logging.report is False


def test_an_override_of_a_text_key_keeps_the_text_typed(tmp_path):
    """YAML read ``run.name=007`` as 7, ``yes`` as True: the run went to a folder ``True``, the
    W&B project ``no`` became 'False'. A key of text keeps what was typed; null is null, a
    quoted value its text, a number key a number, and a YAML file's values stay YAML's."""
    typed = {"007": "007", "yes": "yes", "off": "off", "1e3": "1e3", '"007"': "007", "null": None}
    for text, want in typed.items():
        assert config.load("1f1b_2cpu", [f"run.dir={text}"]).run.dir == want, text
    cfg = config.load("1f1b_2cpu", ["logging.wandb.project=no", "run.name=1.5", "train.steps=3"])
    assert (cfg.logging.wandb.project, cfg.run.name, cfg.train.steps) == ("no", "1.5", 3)
    assert config.load("1f1b_2cpu", ["run.name=${model.kind}-big"]).run.name == "mlp-big"  # (OmegaConf's, still)
    with pytest.raises(UserError, match="could not be converted to Integer"):
        config.load("1f1b_2cpu", ["train.steps=yes"])
    (tmp_path / "e.yaml").write_text("run:\n  name: 007\n")  # (YAML's own reading, as any YAML tool's)
    assert config.load(str(tmp_path / "e.yaml")).run.name == "7"
    # a list of text too (its elements were YAML's: [7, True]); a list of numbers stays numbers
    cfg = config.load("1f1b_2cpu", ['logging.wandb.tags=[007, yes, "a b"]', "pipeline.layers_per_stage=[3,1]"])
    assert list(cfg.logging.wandb.tags) == ["007", "yes", "a b"] and list(cfg.pipeline.layers_per_stage) == [3, 1]
    assert config.load("1f1b_2cpu", ["model.units=null"]).model.units is None


@pytest.mark.parametrize(
    "text, where",
    [
        ("pipeline:\n  schedule: [1f1b\n  stages: 2\n", "line 3, column 9: did not find expected ',' or ']'"),
        ("train:\n\tsteps: 2\n", "line 2, column 1: found character that cannot start any token"),
    ],
)
def test_a_yaml_syntax_error_names_its_line_and_column(tmp_path, text, where):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        config.load(str(path), [])
    assert str(e.value).startswith(f"{path}: {where}") and "\n" not in str(e.value), str(e.value)


def test_an_experiment_that_is_no_mapping_of_keys_is_one_line(tmp_path):
    """A folder, a bare value, a list, a binary file, a pipe: each named as what it is (a pipe or
    /dev/null "did not exist")."""
    (tmp_path / "dir.yaml").mkdir()
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "scalar.yaml").write_text("5\n")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "bin.yaml").write_bytes(bytes(range(128, 256)))
    for name, said in (
        ("dir", "is a folder; give an experiment's YAML file"),
        ("scalar", "must hold a mapping of keys (key: value lines)"),
        ("list", "must hold a mapping of keys (key: value lines)"),
        ("bin", "is not a text file (YAML)"),
        ("fifo", "is not a file (a device, a pipe); give an experiment's YAML file"),
    ):
        with pytest.raises(UserError) as e:
            config.load(str(tmp_path / f"{name}.yaml"), [])
        assert str(e.value) == f"experiment file {tmp_path / name}.yaml {said}"
    with pytest.raises(UserError, match=r"^experiment file /dev/null is not a file \(a device, a pipe\)"):
        config.load("/dev/null", [])


def test_a_yaml_error_in_an_override_names_the_override():
    with pytest.raises(UserError) as e:
        config.load(None, ["train.steps=2", "pipeline.schedule=[1f1b"])
    assert str(e.value).startswith("override 'pipeline.schedule=[1f1b': its value is not YAML: "), str(e.value)


def test_a_bad_key_of_an_experiment_file_names_the_file_and_of_an_override_does_not(tmp_path):
    """A typo or a wrong value in the experiment's YAML says which file holds it; the same in an
    override names the key alone (the command line shows it), also where the file has the key."""
    path = tmp_path / "mine.yaml"
    path.write_text("trian:\n  steps: 3\n")
    with pytest.raises(UserError, match=rf"^{path}: trian: Key 'trian' not in 'Config'. Did you mean: 'train'\?"):
        config.load(str(path), [])
    path.write_text("pipeline:\n  stages: two\n")
    with pytest.raises(UserError, match=rf"^{path}: pipeline.stages: Value 'two'"):
        config.load(str(path), [])
    path.write_text("pipeline:\n  stages: 2\n")
    for override in ("pipeline.stages=two", "pipeline={stages: two}"):  # (the key, or one above it)
        with pytest.raises(UserError, match=r"^pipeline.stages: Value 'two'"):
            config.load(str(path), [override])
    # a null and an interpolation the file holds are the file's too
    for text, said in (("train:\n  steps: null\n", "Incompatible value 'None'"), ("train:\n  steps: ${x.y}\n", "")):
        path.write_text(text)
        with pytest.raises(UserError, match=rf"^{path}: train.steps: {said}"):
            config.load(str(path), [])
    # a key with dots (or brackets) of its own: /etc/os-release's one key of its URLs was not named the file's
    for text, key in (
        ("see.also: 1\n", "see.also"),
        ("train:\n  see.also: 1\n", "train.see.also"),
        ("a[1]: 1\n", "a[1]"),
    ):
        path.write_text(text)
        with pytest.raises(UserError) as e:
            config.load(str(path), [])
        assert str(e.value).startswith(f"{path}: {key}: Key "), str(e.value)


@pytest.mark.parametrize(
    "override, said",
    [
        ("logging.wandb.project=team/exp", r"logging.wandb.project='team/exp': W&B refuses / in a project name"),
        ("logging.wandb.project=a:b?", r"W&B refuses \? : in a project name"),
        ("logging.wandb.project=" + "p" * 129, "W&B takes project names of 128 characters at most"),
        (
            "logging.wandb.tags=[ok," + "t" * 65 + "]",
            "logging.wandb.tags: 'tttt.*' has 65 characters; W&B takes tags of 1 to 64",
        ),
    ],
)
def test_what_wandb_refuses_is_said_before_the_run(override, said):
    """It was a warning after the run that the run went without W&B; W&B's own settings refuse
    the same (the project's characters: each one alone)."""
    from wandb.sdk.wandb_settings import Settings

    from ppx.config.rules import WANDB_PROJECT_REFUSES, check

    with pytest.raises(UserError, match=said):
        check(config.load("1f1b_2cpu", [override]))
    check(config.load("1f1b_2cpu", [override, "logging.wandb.mode=disabled"]))  # (no W&B: nothing refused)
    for c in WANDB_PROJECT_REFUSES:
        with pytest.raises(Exception, match="Invalid project name"):
            Settings(project=f"a{c}b")
    Settings(project="ppx sweep_1.2-x", run_tags=("t" * 64,))  # what ppx lets through, W&B takes
    check(config.load("1f1b_2cpu", ["logging.wandb.project=ppx sweep_1.2-x", "logging.wandb.tags=[" + "t" * 64 + "]"]))


def test_a_home_folder_typed_as_tilde_is_the_home_folder(monkeypatch, tmp_path):
    """No shell expands ~ after "run.root=": ppx made a folder named ~ in the working folder."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = config.load("1f1b_2cpu", ["run.root=~/runs", "run.dir=~/x/y"])
    assert (cfg.run.root, cfg.run.dir) == (str(tmp_path / "runs"), str(tmp_path / "x" / "y"))


def test_a_fault_whose_action_does_not_parse_names_the_key():
    with pytest.raises(UserError, match=r"^runtime.inject_fault='hang@zz': cannot parse action 'zz'"):
        config.load("1f1b_2cpu", ["runtime.inject_fault=hang@zz"])


def test_a_value_where_a_section_goes_names_the_file_and_the_section(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("model: {kind: mlp}\npipeline: 3\n")
    with pytest.raises(UserError, match=rf"^{path}: pipeline: Merge error: int is not a subclass of PipelineConfig"):
        config.load(str(path))


def test_a_fault_to_inject_is_the_runs_not_its_paired_entries():
    """A run.paired entry was checked against the run's runtime.inject_fault, which fires in the
    run's own actions only: a zbv entry beside 1F1B's hang@1B2 was refused (no 1B2 in zbv)."""
    from ppx.config.paired import entry_config

    cfg = config.load("1f1b_2cpu", ["run.paired=[pipeline.schedule=zbv]", "runtime.inject_fault=hang@1B2"])
    assert cfg.runtime.inject_fault == "hang@1B2"
    assert entry_config(cfg, "pipeline.schedule=zbv").runtime.inject_fault is None


@pytest.mark.parametrize(
    "given, said",
    [
        (
            "pipeline.layers_per_stage=3,1",
            "pipeline.layers_per_stage=3,1: a list goes in brackets: pipeline.layers_per_stage=[3,1]",
        ),
        (
            "pipeline.layers_per_stage=3",
            "pipeline.layers_per_stage=3: a list goes in brackets: pipeline.layers_per_stage=[3]",
        ),
        ("model.units=embed", "model.units=embed: a list goes in brackets: model.units=[embed]"),
    ],
)
def test_a_list_given_without_brackets_is_told_to_bracket_it(given, said):
    """OmegaConf said ``Invalid value assigned: str is not a ListConfig, TupleConfig, list, or tuple.``"""
    with pytest.raises(UserError) as e:
        config.load("1f1b_2cpu", [given])
    assert str(e.value) == said


def test_a_list_in_brackets_and_null_still_load():
    assert config.load("1f1b_2cpu", ["pipeline.layers_per_stage=[3,1]"]).pipeline.layers_per_stage == [3, 1]
    assert config.load("1f1b_2cpu", ["pipeline.layers_per_stage=null"]).pipeline.layers_per_stage is None


def test_keys_are_found_by_their_names_text_and_wrapped_on_a_terminal(capsys):
    """`ppx keys train` said "unrecognized arguments"; its lines ran to 700 characters."""
    from ppx.commands.keys import lines

    assert cmd_keys(argparse.Namespace(markdown=False, text="WANDB.mo")) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == ["logging.wandb.mode"]
    with pytest.raises(UserError, match="no key holds 'zzz'"):
        cmd_keys(argparse.Namespace(markdown=False, text="zzz"))
    rows = config.describe()
    assert lines(rows) == [f"{k:28} {d:10} {h}" for k, d, h in rows]  # (a pipe: a row a line)
    wrapped = lines(rows, 80)
    assert max(map(len, wrapped)) <= 80 and len(wrapped) > len(rows)
    assert " ".join(" ".join(wrapped).split()) == " ".join(" ".join(lines(rows)).split())  # (the same words)
