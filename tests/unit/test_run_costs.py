"""A run's costs with what its run.paired entries measured beside it (`ppx.commands.run_costs`):
who lends what, per stage, and what stays unknown. The run directories are written here as
`ppx run` writes them (config.yaml, summary.json), with made-up seconds."""

import json

import pytest

from ppx import config
from ppx.commands.run_costs import run_costs
from ppx.report.run_dir import RunDir

STORE = "pipeline.schedule=zb_h1 train.split_backward=store"
WHOLE0 = {"0": {"mode": "whole"}, "1": {"mode": "store"}}  # ZB-H1 under auto: stage 0 runs whole
STORED = {s: {"mode": "store", "graph_bytes": 1000, "store_bytes": 700} for s in ("0", "1")}


def _samples(**ms) -> dict:
    """ "<stage><op>" -> a few seconds around the given milliseconds."""
    return {k: [v / 1e3, v * 1.1 / 1e3, v * 0.9 / 1e3] for k, v in ms.items()}


def _run(tmp_path, schedule: str, own: dict, ways: dict | None, entries: dict, extra=(), first=None) -> RunDir:
    """A run of transformer_1f1b_2cpu under ``schedule`` that measured ``own`` (``first``: its
    microbatch 0 samples among them) and, beside it, ``entries`` (entry -> (samples, split
    ways) or None where it kept none)."""
    cfg = config.load(
        "transformer_1f1b_2cpu", [f"pipeline.schedule={schedule}", f"run.paired={_value(list(entries))}", *extra]
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.yaml").write_text(config.to_yaml(cfg))
    means = {k: sum(v) / len(v) for k, v in own.items()}
    summary = {
        "status": "completed",
        "schedule": schedule,
        "stages": 2,
        "world_size": 2,
        "microbatches": 4,
        "virtual_stages": 1,
        "model": "transformer",
        "batch_size": 32,
        "step_time_s": 0.04,
        "losses": [1.0],
        "measured_costs": {"action_s": means, "p2p_s": 1e-4, "overhead_s": 1e-5},
        "cost_samples": {
            "action_s": own,
            "p2p_s": [1e-4],
            "overhead_s": [1e-5],
            **({"first_s": first} if first else {}),
        },
        "paired": {
            e: {
                "over_run": 1.0,
                **({"cost_samples": {"action_s": got[0]}, "split_backward": got[1]} if got else {}),
                **({"input_freed_share": got[2]} if got and len(got) > 2 else {}),
                **({"units_per_stage": got[3]} if got and len(got) > 3 else {}),
            }
            for e, got in entries.items()
        },
    }
    if ways:
        summary["split_backward"] = ways
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    return RunDir(tmp_path)


def _value(entries: list[str]) -> str:
    return "[" + ",".join(f'"{e}"' if " " in e else e for e in entries) + "]"


def test_a_1f1b_run_takes_i_and_w_from_zb_h1_beside_it(tmp_path):
    own = _samples(**{"0F": 1, "0B": 3, "1F": 1, "1B": 3})
    lent = _samples(**{"0F": 1.1, "0I": 2.2, "0W": 1, "1F": 1.1, "1I": 2.3, "1W": 1.2})
    got = run_costs(_run(tmp_path, "1f1b", own, None, {STORE: (lent, STORED, [0.3, 0.25])}))
    a = got.measured_costs["action_s"]
    assert a["0B"] == pytest.approx(3e-3) and a["1F"] == pytest.approx(1e-3)  # the run's own stay
    # the entry's, apart; its forwards cost 0.1 ms more than the run's (they store), and that goes
    # with the I it lends, which follows such a forward in each microbatch
    assert a["0I"] == pytest.approx(2.3e-3) and a["1W"] == pytest.approx(1.2e-3)
    assert got.cost_samples["action_s"]["1I"] == pytest.approx([x + 1e-4 for x in lent["1I"]])
    assert got.cost_samples["action_s"]["1W"] == lent["1W"]
    assert got.whole_stages == () and got.split_only == ()
    assert got.lent == (("I and W", (0, 1), STORE),)
    assert got.input_share == (0.3, 0.25)  # what the entry's I freed, with its I
    note = got.note("runs/x")
    assert "I and W on stages 0, 1 from" in note
    assert f"stage 1 +0.100 ms with the I's of {STORE!r}" in note, note


def test_a_storing_run_prices_a_b_lent_by_1f1b_at_its_plain_forward(tmp_path):
    """A ZB-H1 run that stored on every stage: its forwards cost more than 1F1B's beside it, and
    a B lent there is priced with 1F1B's cheaper forward, so that F + B is 1F1B's."""
    own = _samples(**{"0F": 1.2, "0I": 2.2, "0W": 1, "1F": 1.2, "1I": 2.3, "1W": 1.1})
    b = _samples(**{"0F": 1, "0B": 3.1, "1F": 1, "1B": 3.2})
    got = run_costs(
        _run(tmp_path, "zb_h1", own, STORED, {"pipeline.schedule=1f1b": (b, {})}, ["train.split_backward=store"])
    )
    a = got.measured_costs["action_s"]
    assert a["1F"] + a["1B"] == pytest.approx((1 + 3.2) * 1e-3) and a["1F"] == pytest.approx(1.2e-3)
    assert got.lent == (("B", (0, 1), "pipeline.schedule=1f1b"),)
    assert "stage 0 -0.200 ms with the B's of 'pipeline.schedule=1f1b'" in got.note("runs/x")


def test_a_zb_h1_run_takes_b_from_1f1b_and_its_whole_stage_from_a_storing_zb_h1(tmp_path):
    """Under auto, ZB-H1's stage 0 ran whole: its I is a whole B; a storing entry gives I and W
    apart there, and 1F1B the B the run never ran whole on stage 1."""
    own = _samples(**{"0F": 1, "0I": 3, "0W": 0.001, "1F": 1, "1I": 2.3, "1W": 1.1})
    b = _samples(**{"0F": 1, "0B": 3.1, "1F": 1, "1B": 3.2})
    apart = _samples(**{"0F": 1, "0I": 2.2, "0W": 1, "1F": 1, "1I": 2.4, "1W": 1.3})
    run = _run(tmp_path, "zb_h1", own, WHOLE0, {"pipeline.schedule=1f1b": (b, {}), STORE: (apart, STORED)})
    got = run_costs(run)
    a = got.measured_costs["action_s"]
    assert a["0B"] == pytest.approx(3e-3)  # the run's own whole backward, as a B
    assert a["0I"] == pytest.approx(2.2e-3) and a["0W"] == pytest.approx(1e-3)  # not its whole I and empty W
    assert a["1B"] == pytest.approx(3.2e-3) and a["1I"] == pytest.approx(2.3e-3)  # 1F1B's B, its own I
    assert got.whole_stages == () and got.split_only == ()
    assert got.lent == (("B", (1,), "pipeline.schedule=1f1b"), ("I and W", (0,), STORE))


def test_microbatch_0s_samples_stay_only_with_the_runs_own_lists(tmp_path):
    """The run's microbatch 0 samples go with its own lists, and with its whole stage's B (its
    I's); none with a list an entry lent (`split_first` matches them by value: another run's
    values could match by chance)."""
    own = _samples(**{"0F": 1, "0I": 3, "0W": 0.001, "1F": 1, "1I": 2.3, "1W": 1.1})
    first = {k: v[:1] for k, v in own.items()}
    b = _samples(**{"0F": 1, "0B": 3.1, "1F": 1, "1B": 3.2})
    apart = _samples(**{"0F": 1, "0I": 2.2, "0W": 1, "1F": 1, "1I": 2.4, "1W": 1.3})
    entries = {"pipeline.schedule=1f1b": (b, {}), STORE: (apart, STORED)}
    got = run_costs(_run(tmp_path, "zb_h1", own, WHOLE0, entries, first=first)).cost_samples
    assert got["first_s"] == {"0F": first["0F"], "0B": first["0I"], **{k: first[k] for k in ("1F", "1I", "1W")}}
    assert set(got["action_s"]) == {"0F", "0B", "0I", "0W", "1F", "1B", "1I", "1W"}  # (0I, 0W, 1B lent)


def test_an_entry_that_ran_a_stage_whole_lends_no_i_and_w_there(tmp_path):
    """ZB-H1 under auto beside a 1F1B run: stage 1's I and W are lent, stage 0's (one whole
    backward in its I) are not, and stay unknown: a plan refuses what splits it apart."""
    own = _samples(**{"0F": 1, "0B": 3, "1F": 1, "1B": 3})
    entry = _samples(**{"0F": 1, "0I": 3, "0W": 0.001, "1F": 1, "1I": 2.3, "1W": 1.1})
    got = run_costs(_run(tmp_path, "1f1b", own, None, {"pipeline.schedule=zb_h1": (entry, WHOLE0, [1.0, 0.3])}))
    assert got.whole_stages == (0,) and got.input_share == (0.0, 0.3)  # (stage 0's B frees all, as ever)
    assert "0I" not in got.measured_costs["action_s"] and got.measured_costs["action_s"]["1W"] > 0
    assert got.lent == (("I and W", (1,), "pipeline.schedule=zb_h1"),)


@pytest.mark.parametrize(
    "entry,why",
    [
        ("pipeline.schedule=zb_h1 train.batch_size=64", "another microbatch size costs otherwise"),
        ("pipeline.schedule=zbv", "4 stages, not the run's 2"),
    ],
)
def test_an_entry_that_costs_otherwise_lends_nothing(tmp_path, entry, why):
    own = _samples(**{"0F": 1, "0B": 3, "1F": 1, "1B": 3})
    entry_costs = _samples(**{f"{s}{op}": 1 for s in range(4) for op in "FIW"})
    run = _run(tmp_path, "1f1b", own, None, {entry: (entry_costs, STORED)})
    got = run_costs(run)
    assert got.measured_costs is run.summary.measured_costs and not got.lent, why
    assert got.note("runs/x") is None


def test_an_entry_of_another_stage_count_prices_that_count_with_its_own_actions(tmp_path):
    """ZB-V (4 stages) beside a 1F1B run of 2: it lends nothing to the run's stages, and all its
    actions price 4-stage candidates (its whole stage 0's I as a B). An entry that split a stage
    another way than the commands do prices nothing."""
    own = _samples(**{"0F": 1, "0B": 3, "1F": 1, "1B": 3})
    zbv = _samples(**{f"{s}{op}": 1 for s in range(4) for op in "FIW"})
    ways = {"0": {"mode": "whole"}, **{str(s): STORED["0"] for s in (1, 2, 3)}}
    run = _run(
        tmp_path / "a", "1f1b", own, None, {"pipeline.schedule=zbv": (zbv, ways, [1, 0.3, 0.3, 0.3], [2, 1, 1, 2])}
    )
    got = run_costs(run)
    assert got.measured_costs is run.summary.measured_costs and not got.lent
    (at,) = got.at_stages
    assert (at.stages, at.units, at.sources) == (4, (2, 1, 1, 2), ("pipeline.schedule=zbv",))
    assert at.action_s["0B"] == zbv["0I"] and "0I" not in at.action_s and "0W" not in at.action_s
    assert at.action_s["3W"] == zbv["3W"]
    assert "every action at 4 stages from 'pipeline.schedule=zbv'" in got.note("runs/x")
    graph = {**ways, "2": {"mode": "graph", "why": "train.split_backward=graph"}}
    other = _run(tmp_path / "b", "1f1b", own, None, {"pipeline.schedule=zbv": (zbv, graph, [], [2, 1, 1, 2])})
    assert run_costs(other).at_stages == () and run_costs(other).other_way == (("pipeline.schedule=zbv", (2,)),)
    assert "split stage 2 another way than the plan's commands do" in run_costs(other).note("runs/x")


def test_a_stall_of_the_machine_is_left_out_of_the_costs(tmp_path):
    """One sample 50x its action's median (a 65 ms pause among 1.2 ms I's): not the action's
    cost, left out of the samples and the mean, the run's and an entry's alike; the rest stay."""
    own = _samples(**{"0F": 1, "0B": 3, "1F": 1, "1B": 3})
    own["1B"] = [*own["1B"], 0.15]
    lent = _samples(**{"0F": 1.1, "0I": 2.2, "0W": 1, "1F": 1.1, "1I": 2.3, "1W": 1.2})
    lent["0W"] = [*lent["0W"], 0.05]
    got = run_costs(_run(tmp_path, "1f1b", own, None, {STORE: (lent, STORED)}))
    a, drawn = got.measured_costs["action_s"], got.cost_samples["action_s"]
    assert drawn["1B"] == own["1B"][:-1] and a["1B"] == pytest.approx(3e-3)
    assert drawn["0W"] == lent["0W"][:-1] and a["0W"] == pytest.approx(1e-3)
    assert drawn["0B"] == own["0B"] and a["0F"] == pytest.approx(1e-3)
    assert got.stalls == 2 and "2 action sample(s) of runs/x or its entries over 10x their action's median" in got.note(
        "runs/x"
    )
    calm = _run(tmp_path / "calm", "1f1b", _samples(**{"0F": 1, "0B": 3, "1F": 1, "1B": 3}), None, {})
    assert run_costs(calm).measured_costs is calm.summary.measured_costs  # (nothing left out: as it was)
    # one in most steps (3 of 5 timeline steps: a step's first forward gathering its weights) is a cost, and stays
    every = _samples(**{"0F": 1, "0B": 3, "1F": 1, "1B": 3})
    every["0F"] = every["0F"] * 5 + [0.05] * 3
    again = run_costs(_run(tmp_path / "every", "1f1b", every, None, {}))
    assert again.cost_samples["action_s"]["0F"] == every["0F"] and again.stalls == 0
    # a sub-ms action's 1-4 ms one-off is no stall (under 10 ms above its median)
    short = _samples(**{"0F": 0.1, "0B": 0.2, "1F": 0.1, "1B": 0.2})
    short["0B"] = [*short["0B"], 0.004]
    assert run_costs(_run(tmp_path / "short", "1f1b", short, None, {})).stalls == 0


def test_a_run_whose_entries_kept_nothing_is_its_own(tmp_path):
    """Runs from before entries kept their actions (or without timers): the run's costs as they were."""
    own = _samples(**{"0F": 1, "0I": 3, "0W": 0.001, "1F": 1, "1I": 2.3, "1W": 1.1})
    run = _run(tmp_path, "zb_h1", own, WHOLE0, {"pipeline.schedule=1f1b": None})
    got = run_costs(run)
    assert got.measured_costs is run.summary.measured_costs
    assert got.whole_stages == (0,) and got.split_only == (1,)


def test_an_entry_lends_i_and_w_only_where_it_split_as_the_plans_commands_will(tmp_path):
    """The plan's commands split as the run's config says (store, graph; auto, where auto stores
    only if the stores hold no more than the graph): a storing entry does not price a graph run's
    candidates, nor a stage where auto keeps the graph, and the note says so."""
    own = _samples(**{"0F": 1, "0B": 3, "1F": 1, "1B": 3})
    lent = _samples(**{"0F": 1, "0I": 2.2, "0W": 1, "1F": 1, "1I": 2.3, "1W": 1.2})
    graph = run_costs(_run(tmp_path / "g", "1f1b", own, None, {STORE: (lent, STORED)}, ["train.split_backward=graph"]))
    assert not graph.lent and graph.other_way == ((STORE, (0, 1)),)
    assert "split stages 0, 1 another way than the plan's commands do" in graph.note("runs/x")
    larger = {"0": STORED["0"], "1": {"mode": "store", "graph_bytes": 1000, "store_bytes": 1300}}
    auto = run_costs(_run(tmp_path / "a", "1f1b", own, None, {STORE: (lent, larger)}))
    assert auto.lent == (("I and W", (0,), STORE),) and auto.other_way == ((STORE, (1,)),)
    assert auto.whole_stages == (1,)  # (its I and W unknown as auto runs them: a plan refuses splitting it)


def test_a_whole_stage_joins_the_b_it_ran_whole_to_the_b_it_ran(tmp_path):
    """A drain run's first stage ran B's and, at its drain, I's that run whole: both are whole
    backwards, so both price its B once something is lent."""
    own = _samples(**{"0F": 1, "0B": 3, "0I": 3.3, "0W": 0.001, "1F": 1, "1B": 3, "1I": 2.3, "1W": 1.1})
    lent = _samples(**{"0F": 1, "0I": 2.2, "0W": 1, "1F": 1, "1I": 2.3, "1W": 1.2})
    drain = {"0": {"mode": "whole"}, "1": STORED["1"]}
    got = run_costs(_run(tmp_path, "zb_h1", own, drain, {STORE: (lent, STORED)}, ["train.split_backward=drain"]))
    assert got.cost_samples["action_s"]["0B"] == own["0B"] + own["0I"]
    assert got.measured_costs["action_s"]["0B"] == pytest.approx((3 + 3.3) / 2 * 1e-3)
    assert got.measured_costs["action_s"]["1B"] == pytest.approx(3e-3)  # (untouched: the run's own mean)
    assert got.lent == (("I and W", (0,), STORE),)


def test_entries_that_kept_no_costs_are_named(tmp_path):
    own = _samples(**{"0F": 1, "0B": 3, "1F": 1, "1B": 3})
    got = run_costs(_run(tmp_path, "1f1b", own, None, {STORE: None}))
    assert got.unkept == (STORE,) and not got.lent
    assert "kept no action costs" in got.note("runs/x") and "run it again" in got.note("runs/x")


def test_an_entry_that_ran_a_stage_drained_lends_its_i_without_its_forwards_difference(tmp_path):
    """Drained, an entry's stage stored on a few microbatches only: its forward's median is a
    plain one's, and no difference goes with the I it lends there."""
    own = _samples(**{"0F": 1, "0B": 3, "1F": 1, "1B": 3})
    drain = "pipeline.schedule=zb_h1 train.split_backward=drain"
    ways = {"0": {"mode": "whole"}, "1": {**STORED["1"], "whole_microbatches": [0, 1]}}
    lent = _samples(**{"0F": 1.2, "0I": 3, "0W": 0.001, "1F": 1.2, "1B": 3.1, "1I": 2.3, "1W": 1.2})
    got = run_costs(_run(tmp_path, "1f1b", own, None, {drain: (lent, ways)}))
    assert got.lent == (("I and W", (1,), drain),)
    assert got.cost_samples["action_s"]["1I"] == lent["1I"] and got.forward_shift == ()


def test_simulating_the_stage_count_of_an_entry_keeps_none_of_the_runs_lending(tmp_path):
    """`ppx simulate --from-run` at an entry's stage count takes that entry's actions: the run's
    own stages' lending, forward differences included, is not its to note."""
    from ppx.commands.run_costs import RunCosts
    from ppx.commands.simulate_run import as_run_costs
    from ppx.plan.inputs import MeasuredAt

    own = RunCosts(
        {"action_s": {"0F": 1e-3}},
        {"action_s": {"0F": [1e-3]}},
        (),
        (),
        lent=(("I and W", (0,), STORE),),
        forward_shift=((STORE, 0, "I", 5e-4),),
    )
    at = MeasuredAt(4, (1, 1, 1, 1), {f"{s}{op}": [1e-3] for s in range(4) for op in "FB"}, ("pipeline.schedule=zbv",))
    got = as_run_costs(own, at)
    assert got.forward_shift == () and got.lent == () and got.note("runs/x") is None


def test_simulate_from_a_run_imports_no_torch(tmp_path):
    """`ppx simulate --from-run` reads files and simulates: it answers without torch (a second
    and more of import on a laptop-class CPU)."""
    import subprocess
    import sys

    own = _samples(**{"0F": 1, "0B": 3, "1F": 1, "1B": 3})
    run = _run(tmp_path / "run", "1f1b", own, None, {})
    code = (
        "import sys; from ppx.cli import main; main(['simulate', '1f1b', '--from-run', sys.argv[1]]); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    r = subprocess.run([sys.executable, "-c", code, str(run.path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "predicted step time" in r.stdout, r.stdout + r.stderr


def test_a_simulation_names_only_the_lent_costs_its_list_runs():
    """`ppx simulate --from-run`'s note: a B an entry lent for a stage the list splits (or an I
    and W for one it runs whole) prices nothing of it, and goes unnamed."""
    from ppx import schedules
    from ppx.commands.run_costs import RunCosts

    lent = (("B", (1,), "pipeline.schedule=1f1b"), ("I and W", (0, 1), "pipeline.schedule=zb_h1"))
    own = RunCosts({"action_s": {}}, None, (), (), lent=lent, forward_shift=(("pipeline.schedule=1f1b", 1, "B", 1e-3),))
    zb = schedules.build("zb_h1", 2, 4)
    got = own.used_by(zb)
    assert got.lent == (("I and W", (0, 1), "pipeline.schedule=zb_h1"),) and got.forward_shift == ()
    assert own.used_by(zb, {0}).lent == (("I and W", (1,), "pipeline.schedule=zb_h1"),)  # (stage 0 whole: B's)
    got = own.used_by(schedules.build("1f1b", 2, 4))
    assert got.lent == (("B", (1,), "pipeline.schedule=1f1b"),) and got.forward_shift == own.forward_shift


def test_a_stage_of_no_parameter_is_not_a_stage_run_whole_to_a_plan(tmp_path):
    """A stage holding no parameter runs its backward whole (its I) under every way, and its W
    (nothing) is measured all the same: its I and W are known, so the plan refuses no split
    candidate for it (it refused zbv and the rest, and named a run that could not help)."""
    from ppx.commands.common import whole_stages
    from ppx.commands.run_costs import _as_commands
    from ppx.report.run_dir import RunDir

    bare = {"mode": "whole", "why": "it holds no parameter, so no W: one backward, in the I", "no_parameters": True}
    ways = {"0": {"mode": "whole", "why": "each I followed at once by its W: one backward, in the I"}, "1": bare}
    (tmp_path / "summary.json").write_text(json.dumps({"split_backward": ways}))
    assert whole_stages(RunDir(tmp_path)) == [0]
    assert all(_as_commands(way, bare) for way in ("auto", "store", "graph"))
