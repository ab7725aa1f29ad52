"""Run labels: each run named by the config values that vary between the runs, short and
unique; `ppx compare` puts them in compare.md, compare.json and on compare.png's axes."""

import json

from ppx import config
from ppx.report.labels import flatten, run_labels, shared_label


def cfg(schedule="1f1b", p=2, v=1, m=4, **more):
    """A flattened config as `flat_config` gives it (a few of the keys)."""
    c = {
        "pipeline.schedule": schedule,
        "pipeline.stages": p,
        "pipeline.microbatches": m,
        "pipeline.virtual_stages": v,
        "pipeline.layers_per_stage": None,
        "model.kind": "mlp",
        "model.hidden": 64,
        "train.lr": 0.01,
        "logging.tensorboard": True,
        "run.name": "exp",
        "run.dir": None,
    }
    c.update(more)
    return c


def test_a_schedule_by_microbatches_sweep():
    configs = [cfg(s, m=m, **{"run.dir": f"/r/{s}{m}"}) for s in ("gpipe", "1f1b") for m in (2, 16)]
    assert run_labels(configs, ["a", "b", "c", "d"]) == ["gpipe m=2", "gpipe m=16", "1f1b m=2", "1f1b m=16"]
    assert shared_label(configs) == "p=2 model=mlp"


def test_interleaved_shows_v_beside_its_schedule_and_alone_where_v_varies():
    assert run_labels([cfg("1f1b"), cfg("interleaved_1f1b", v=2)], ["a", "b"]) == ["1f1b", "interleaved_1f1b v=2"]
    runs = [cfg("interleaved_1f1b", v=1, m=8), cfg("interleaved_1f1b", v=2, m=8)]
    assert run_labels(runs, ["a", "b"]) == ["v=1", "v=2"]
    assert shared_label(runs) == "interleaved_1f1b p=2 m=8 model=mlp"
    mixed = [cfg("1f1b", p=4), cfg("interleaved_1f1b", v=2, p=2), cfg("interleaved_1f1b", v=4, p=2)]
    assert run_labels(mixed, ["a", "b", "c"]) == ["1f1b p=4", "interleaved_1f1b p=2 v=2", "interleaved_1f1b p=2 v=4"]


def test_model_settings_and_other_keys_by_their_last_part():
    assert run_labels([cfg(**{"model.hidden": 64}), cfg(**{"model.hidden": 256})], ["a", "b"]) == [
        "hidden=64",
        "hidden=256",
    ]
    two = [cfg(m=2, **{"train.lr": 0.1, "model.hidden": 256}), cfg(m=4, **{"train.lr": 1e-3})]
    assert run_labels(two, ["a", "b"]) == ["m=2 hidden=256 lr=0.1", "m=4 hidden=64 lr=0.001"]
    # two keys with one last part keep their whole names
    clash = [cfg(**{"a.size": 1, "b.size": 1}), cfg(**{"a.size": 2, "b.size": 3})]
    assert run_labels(clash, ["a", "b"]) == ["a.size=1 b.size=1", "a.size=2 b.size=3"]
    lists = [cfg(**{"pipeline.layers_per_stage": [3, 1]}), cfg()]
    assert run_labels(lists, ["a", "b"]) == ["layers_per_stage=[3,1]", "layers_per_stage=None"]


def test_identical_configs_fall_back_to_their_folders_and_stay_unique():
    same = [cfg(**{"run.dir": "/x/1", "logging.tensorboard": False}), cfg(**{"run.dir": "/x/2"})]
    assert run_labels(same, ["exp/20261123-101500", "exp/20261123-101600"]) == ["20261123-101500", "20261123-101600"]
    # a label two runs share gets the folder; one folder name in two places, the whole path
    three = [cfg(m=2), cfg(m=4), cfg(m=4)]
    assert run_labels(three, ["a/run", "b/run", "c/run"]) == ["m=2", "m=4 (b/run)", "m=4 (c/run)"]
    assert run_labels([cfg(), cfg()], ["x", "x"]) == ["x #0", "x #1"]


def test_one_run_is_its_schedule_p_and_m():
    assert run_labels([cfg("gpipe", p=4, m=16)], ["a"]) == ["gpipe p=4 m=16"]
    assert run_labels([cfg("interleaved_1f1b", p=2, v=2, m=4)], ["a"]) == ["interleaved_1f1b p=2 v=2 m=4"]


def test_flatten_keeps_order_and_lists():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None}) == {"a.b": 1, "a.c.d": [1, 2], "e": None}


def _run_dir(path, schedule, m, bubble):
    path.mkdir(parents=True)
    summary = {
        "schedule": schedule,
        "stages": 2,
        "world_size": 2,
        "microbatches": m,
        "virtual_stages": 1,
        "model": "mlp",
        "batch_size": 32,
        "step_time_s": 0.01 * m,
        "bubble_fraction": bubble,
        "bubble_fraction_theory": 1 / (m + 1),
        "losses": [0.5, 0.25],
        "ranks": [{"rank": 0, "peak_activation_bytes": 2048}, {"rank": 1, "peak_activation_bytes": 1024}],
    }
    (path / "summary.json").write_text(json.dumps(summary))
    cfg = config.load("1f1b_2cpu", ["train.steps=2", f"pipeline.schedule={schedule}", f"pipeline.microbatches={m}"])
    (path / "config.yaml").write_text(config.to_yaml(cfg))


def test_compare_writes_the_labels(tmp_path):
    from ppx.report.compare import compare

    _run_dir(tmp_path / "runs" / "one", "1f1b", 2, 0.4)
    _run_dir(tmp_path / "runs" / "two", "gpipe", 8, 0.2)
    out = tmp_path / "cmp"
    text = compare([str(tmp_path / "runs")], out)
    table = (out / "compare.md").read_text()
    assert table.startswith("| run | label | schedule |")
    assert "| one | 1f1b m=2 | 1f1b |" in table and "| two | gpipe m=8 | gpipe |" in table
    rows = json.loads((out / "compare.json").read_text())
    assert [(r["name"], r["label"]) for r in rows] == [("one", "1f1b m=2"), ("two", "gpipe m=8")]
    assert list(rows[0])[:3] == ["name", "label", "path"]
    assert text.splitlines()[0].split()[:3] == ["run", "label", "schedule"] and "gpipe m=8" in text
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "bubble.png").exists()


def test_an_interleaved_run_is_labelled_by_its_ranks(tmp_path):
    from ppx.report.labels import flat_config
    from ppx.report.run_dir import RunDir

    _run_dir(tmp_path / "il", "interleaved_1f1b", 4, 0.1)
    summary = json.loads((tmp_path / "il" / "summary.json").read_text())
    summary.update(stages=4, virtual_stages=2)  # 2 ranks, 2 stages each
    (tmp_path / "il" / "summary.json").write_text(json.dumps(summary))
    flat = flat_config(RunDir(tmp_path / "il"))
    assert flat["pipeline.stages"] == 2 and flat["pipeline.virtual_stages"] == 2


def test_long_labels_are_wrapped_and_every_panel_keeps_its_room(tmp_path, recwarn):
    """Five runs labelled by three long keys each: compare.png wraps them at their spaces, and
    matplotlib lays the panels out with room for them (it warned "Tight layout not applied" and
    drew them over the panels below when they were single slanted lines)."""
    from ppx.report.compare import plot_runs

    keys = "recompute=selective split_backward=graph dtype=bf16 executor=torch"
    rows = [
        {"name": f"r{k}", "label": f"zb_h1 v={k} {keys}", "step_ms": 10.0 + k, "throughput": 100.0}
        | {"peak_mem_mib": 200.0, "peak_act_kib": 3000.0, "bubble": 0.2, "predicted": 0.2, "theory": 0.1}
        for k in range(5)
    ]
    plot_runs(rows, tmp_path / "compare.png", "5 runs")
    assert not [w for w in recwarn if "ight layout" in str(w.message)], [str(w.message) for w in recwarn]


def test_keys_a_run_leaves_unset_are_left_out_of_its_label_where_others_name_it():
    """An mlp run beside a `model.kind=module` run: the module's keys vary, but the mlp run
    leaves them unset; its label names what it sets, not module=None units=None ..."""
    mlp = cfg(**{"model.module": None, "model.units": None, "model.args": {}})
    own = cfg(**{"model.kind": "module", "model.module": "my:build", "model.units": "blocks", "model.args": {"w": 8}})
    assert run_labels([mlp, own], ["a", "b"]) == [
        "model=mlp",
        "model=module module=my:build units=blocks args={'w': 8}",
    ]


def test_a_model_kinds_own_keys_are_no_part_of_another_kinds_label():
    """A known-cost run beside an mlp run: the mlp run's config holds model.fwd_ms at its
    default, which nothing of it reads; its label names its model, not fwd_ms=10."""
    mlp = cfg(**{"model.fwd_ms": 10.0, "model.bwd_ms": 20.0, "model.hf_config": None})
    known = cfg(**{"model.kind": "synthetic", "model.fwd_ms": 2.0, "model.bwd_ms": 20.0, "model.hf_config": None})
    hf = cfg(**{"model.kind": "hf", "model.fwd_ms": 5.0, "model.bwd_ms": 20.0, "model.hf_config": "llama"})
    assert run_labels([mlp, known, hf], ["a", "b", "c"]) == [
        "model=mlp",
        "model=synthetic fwd_ms=2",
        "model=hf hf_config=llama",
    ]
