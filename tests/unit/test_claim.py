"""Run directories claimed by the launcher (ppx.launch.claim)."""

from ppx import config
from ppx.launch.claim import claim, new_folder


def test_run_directories_claimed_in_one_second_are_distinct(tmp_path):

    cfg = config.load("gpipe_2cpu", [f"run.root={tmp_path}"])
    first, second, third = claim(cfg), claim(cfg), claim(cfg)  # within a second, mostly: same stamp
    assert len({first, second, third}) == 3 and all(p.is_dir() for p in (first, second, third))
    stamp = first.name
    if second.name.startswith(stamp):
        assert second.name == f"{stamp}-1"


def test_a_sweep_begun_in_the_same_second_as_another_gets_a_folder_of_its_own(tmp_path):
    """(The second sweep of a second stopped: ``sweep directory ... already exists``.)
    `ppx.launch.sweep.run_sweep` takes its folder as a run takes its own."""
    (tmp_path / "sweep-20261130-030618").mkdir()
    (tmp_path / "sweep-20261130-030618-1").mkdir()
    got = new_folder(tmp_path, "sweep-20261130-030618")
    assert got == tmp_path / "sweep-20261130-030618-2" and got.is_dir()
    assert new_folder(tmp_path, "sweep-20261130-030619") == tmp_path / "sweep-20261130-030619"


def test_a_run_keeps_a_copy_of_each_schedule_csv_it_reads(tmp_path):
    """write_config: config.yaml, and under schedules/ the run's CSV and its run.paired entries'
    as they were (two of one name from two folders both kept; a name, or one CSV twice, once)."""
    from ppx.launch.claim import write_config

    mine, other = tmp_path / "a" / "order.csv", tmp_path / "b" / "order.csv"
    for path, rank1 in ((mine, "1F0,1B0,1F1,1B1"), (other, "1F0,1F1,1B0,1B1")):
        path.parent.mkdir()
        path.write_text(f"0F0,0F1,0B0,0B1\n{rank1}\n")
    again = tmp_path / "a" / ".." / "a" / "order.csv"  # (the same file spelled otherwise: one copy)
    entries = [f"pipeline.schedule={other}", "pipeline.schedule=zb_h1", f"pipeline.schedule={again} train.lr=0.1"]
    cfg = config.load("1f1b_2cpu", [f"pipeline.schedule={mine}", "pipeline.microbatches=2", f"run.paired={entries}"])
    run = tmp_path / "run"
    run.mkdir()
    write_config(run, cfg)
    mine.write_text("edited after the run started\n")
    assert config.from_yaml(run / "config.yaml").pipeline.schedule == str(mine)
    assert sorted(p.name for p in (run / "schedules").iterdir()) == ["order-1.csv", "order.csv"]
    assert (run / "schedules" / "order.csv").read_text() == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
    assert (run / "schedules" / "order-1.csv").read_text() == other.read_text()
    plain = tmp_path / "plain"
    plain.mkdir()
    write_config(plain, config.load("1f1b_2cpu", []))
    assert sorted(p.name for p in plain.iterdir()) == ["config.yaml"]  # (no CSV: no folder)


def test_a_run_dir_that_is_a_link_to_nothing_is_said_so(tmp_path):
    import pytest

    from ppx.errors import UserError
    from ppx.launch.claim import check_free

    link = tmp_path / "run"
    link.symlink_to(tmp_path / "nowhere")
    cfg = config.load("gpipe_2cpu", [f"run.dir={link}"])
    with pytest.raises(UserError) as e:
        check_free(cfg)
    assert (
        str(e.value)
        == f"run.dir={link} is a link to {tmp_path / 'nowhere'}, which does not exist; give another run.dir"
    )
    assert not (tmp_path / "nowhere").exists()


def test_a_schedule_that_cannot_be_read_is_said_so_and_no_run_folder_is_left(tmp_path):
    import pytest

    from ppx import schedules
    from ppx.errors import UserError
    from ppx.launch.claim import write_config

    csv = tmp_path / "mine.csv"
    schedules.write_csv(schedules.build("1f1b", 2, 4).compute_only(), csv)
    cfg = config.load("gpipe_2cpu", [f"pipeline.schedule={csv}", f"run.root={tmp_path / 'runs'}"])
    run = claim(cfg)
    csv.unlink()  # (gone between the config's checks and the run's copy)
    with pytest.raises(UserError) as e:
        write_config(run, cfg)
    assert str(e.value) == f"cannot read {csv}: No such file or directory"
    assert not run.exists()


def test_no_run_is_claimed_inside_another_and_a_path_beside_one_is_free(tmp_path, monkeypatch):
    """claim itself refuses (a torchrun or srun of one's own claims without ppx run's checks);
    a run's folder is its config.yaml beside its status/ (a project folder with a config.yaml
    and a metrics.jsonl of its own is none), and ../ from inside a run leaves it."""
    import pytest

    from ppx.errors import UserError
    from ppx.report.run_dir import run_holding

    run = tmp_path / "a_run"
    (run / "status").mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    for key in (f"run.dir={run / 'tb' / 'x'}", f"run.root={run}"):
        with pytest.raises(UserError, match=rf"the run would go inside the run {run}; ppx never writes into a run"):
            claim(config.load("1f1b_2cpu", [key]))
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "status"]
    monkeypatch.chdir(run)
    assert run_holding("plan") == run and run_holding("../beside") is None
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.yaml").write_text("{}\n")
    (project / "metrics.jsonl").write_text("")
    assert run_holding(project / "runs" / "x") is None
