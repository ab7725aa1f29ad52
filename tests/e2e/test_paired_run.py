"""``run.paired``: configs run step by step beside a run, in its processes (ppx.engine.paired):
every step has one of each beside it, timed as the run's are, and summary.json holds each one's
step over the run's and whether their losses agree."""

from __future__ import annotations

import re

from helpers import ppx, read_json, read_jsonl


def test_schedules_beside_a_run_give_its_losses_and_their_steps(tmp_path):
    """The MLP under 1F1B with GPipe (recomputing) and ZB-H1 (drain) beside it: the same losses at every step (the same
    seed, data and optimizer; only the order of the work differs), a ratio per step; a config
    that computes otherwise (another learning rate) is said to differ, from its second step;
    the run's own config beside it is the floor, which every other entry is held against too."""
    entries = [
        "pipeline.schedule=gpipe train.recompute=full",
        "pipeline.schedule=zb_h1 train.split_backward=drain",
        "train.lr=0.05",
        "pipeline.schedule=1f1b",
    ]
    listed = "[" + ",".join(f'"{e}"' for e in entries) + "]"
    run = tmp_path / "run"
    r = ppx("run", "1f1b_2cpu", "train.steps=6", f"run.paired={listed}", f"run.dir={run}", "logging.report=true")
    assert r.returncode == 0, r.stderr
    s = read_json(tmp_path / "run" / "summary.json")
    assert list(s["paired"]) == entries
    for entry in entries:
        row = s["paired"][entry]
        assert row["pairs"] == 6 and row["median_step_s"] > 0 and 0.2 < row["over_run"] < 5
        q1, q3 = row["over_run_q1_q3"]
        lo, hi = row["over_run_ci95"]  # 6 pairs: the smallest and largest ratio
        assert lo <= q1 <= row["over_run"] <= q3 <= hi
    assert s["paired"]["pipeline.schedule=gpipe train.recompute=full"]["losses_equal"] is True
    assert s["paired"]["pipeline.schedule=zb_h1 train.split_backward=drain"]["losses_equal"] is True
    lr = s["paired"]["train.lr=0.05"]
    assert lr["losses_equal"] is False and lr["first_loss_difference_step"] == 1  # step 0: the same weights
    assert "ppx: paired 'pipeline.schedule=gpipe train.recompute=full': step " in r.stdout
    assert "losses equal at every step" in r.stdout and "losses differ from step 1" in r.stdout
    # the run's own records are its alone: as many steps, its own schedule, its split
    assert s["schedule"] == "1f1b" and len(s["step_times_s"]) == 6 and s["units_per_stage"] == [2, 2]
    # every step's line holds each entry's step and loss, and those make the summary
    lines = read_jsonl(run / "metrics.jsonl")
    assert [len(line["paired"]) for line in lines] == [4] * 6
    lr_losses = [line["paired"][2]["loss"] for line in lines]
    assert lr_losses[0] == lines[0]["loss"] and lr_losses[1] != lines[1]["loss"]
    ratios = sorted(line["paired"][0]["step_time_s"] / line["step_time_s"] for line in lines)
    assert s["paired"][entries[0]]["over_run"] == (ratios[2] + ratios[3]) / 2
    floor = s["paired"]["pipeline.schedule=1f1b"]
    assert floor["floor"] is True and "over_floor" not in floor
    against = sorted(line["paired"][1]["step_time_s"] / line["paired"][3]["step_time_s"] for line in lines)
    drain = s["paired"][entries[1]]
    assert drain["floor_entry"] == "pipeline.schedule=1f1b" and drain["over_floor"] == (against[2] + against[3]) / 2
    assert drain["over_floor_ci95"] == [against[0], against[-1]]
    assert "ppx: paired 'pipeline.schedule=1f1b' (the run's own config: the floor): step " in r.stdout
    assert "x the floor's ('pipeline.schedule=1f1b'): " in r.stdout
    page = (run / "report.html").read_text()
    assert 'id="paired"' in page and "configs beside the run" in page and "differ from step 1" in page
    assert "(the floor: the run&#x27;s own config)" in page
    # ppx compare says what ran beside the run, the floor among it
    r = ppx("compare", str(run), "--out", str(tmp_path / "compared"))
    assert r.returncode == 0, r.stderr
    what = "each entry's median ratio of its step to the step beside it"
    assert f"note: beside 1f1b p=2 m=4 (run.paired, 6 pairs), {what}: " in r.stdout
    assert "'pipeline.schedule=1f1b' (the run's own config: the floor) " in r.stdout and "x the floor's (" in r.stdout
    assert "(run.paired, 6 pairs)" in (tmp_path / "compared" / "compare.md").read_text()
    assert page.count("train.split_backward=drain") >= 2  # the table's row and config.yaml


def test_an_entry_that_hangs_or_diverges_ends_the_job_naming_it(tmp_path):
    """An entry's forward that outlasts runtime.timeout_s (the known-cost model's 6 s beside the
    MLP's milliseconds, at 2 s) ends the job with the watchdog's one line, naming the entry and
    its action; an entry whose loss turns nan (train.lr=1e30) ends it with a line naming it."""
    hung = tmp_path / "hung"
    r = ppx(
        "run", "1f1b_2cpu", "train.steps=3", "runtime.timeout_s=2",
        "run.paired=['model.kind=synthetic model.fwd_ms=6000']", f"run.dir={hung}",
    )  # fmt: skip
    assert r.returncode != 0
    late = re.search(r"made no progress for (\d+\.\d) s", r.stderr)  # (2 s, or later on a loaded machine)
    assert late and float(late.group(1)) >= 2.0, r.stderr
    assert "on paired 'model.kind=synthetic model.fwd_ms=6000': 0F0 (step 0)" in r.stderr, r.stderr
    assert (hung / "incomplete.txt").exists() and not (hung / "summary.json").exists()
    nan = tmp_path / "nan"
    r = ppx("run", "1f1b_2cpu", "train.steps=4", "run.paired=[train.lr=1e30]", f"run.dir={nan}")
    assert r.returncode != 0 and "run.paired 'train.lr=1e30': the loss is nan at step" in r.stderr, r.stderr
    assert not (nan / "summary.json").exists()


def test_a_profiled_run_keeps_its_steps_and_labels_the_entries_apart(tmp_path):
    """With the profiler on, every PP: action lies inside the run's ProfilerStep#; the entry's
    actions are PAIRED0:, outside them, under one ppx:paired mark per step traced."""
    import json

    run = tmp_path / "run"
    r = ppx("run", "1f1b_2cpu", "train.steps=4", "run.paired=[pipeline.schedule=gpipe]", "profile.enabled=true",
            f"run.dir={run}")  # fmt: skip
    assert r.returncode == 0, r.stderr
    traces = sorted((run / "tb").glob("*.pt.trace.json"))
    assert len(traces) == 2
    for t in traces:
        events = [e for e in json.loads(t.read_text())["traceEvents"] if e.get("ph") == "X"]
        steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#")]

        def inside(e, steps=steps):
            return any(a <= e["ts"] <= b for a, b in steps)

        own = [e for e in events if e["name"].startswith("PP:")]
        theirs = [e for e in events if e["name"].startswith("PAIRED0:")]
        marks = {e["name"] for e in events if e["name"].startswith("ppx:paired")}
        assert len(steps) == 2 and own and theirs
        assert all(inside(e) for e in own) and not any(inside(e) for e in theirs)
        assert marks == {"ppx:paired pipeline.schedule=gpipe"}


def test_an_fp16_entry_reports_its_skipped_optimizer_steps_as_the_run_does(tmp_path):
    """fp16 loss scaling: an entry's optimizer steps pass through the same overflow check as the
    run's, and summary.json and metrics.jsonl say of each entry what they say of the run."""
    run = tmp_path / "run"
    r = ppx(
        "run",
        "1f1b_2cpu",
        "train.dtype=fp16",
        "train.steps=2",
        "run.paired=[pipeline.schedule=gpipe]",
        f"run.dir={run}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_json(run / "summary.json")
    assert s["paired"]["pipeline.schedule=gpipe"]["optimizer_steps_skipped"] == s["optimizer_steps_skipped"] == 0
    for line in read_jsonl(run / "metrics.jsonl"):
        assert line["paired"][0]["optimizer_skipped"] is line["optimizer_skipped"] is False, line
