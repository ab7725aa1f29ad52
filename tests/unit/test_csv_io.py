"""Schedules as CSV (ppx.schedules.csv_io): round trips with and without comms, torch's idle
cells, and duplicates named as written."""

from __future__ import annotations

import pytest

from ppx import schedules
from ppx.errors import ScheduleError


@pytest.mark.parametrize("with_comms", [False, True])
def test_csv_round_trip(tmp_path, with_comms):
    sched = schedules.build("1f1b", 3, 4)
    path = tmp_path / "s.csv"
    schedules.write_csv(sched if with_comms else sched.compute_only(), path)
    text = path.read_text().splitlines()
    assert text[0].startswith("0F0,0SEND_F0,0F1," if with_comms else "0F0,0F1,")
    back = schedules.from_csv(path)
    assert back.actions == sched.actions
    assert back.stage_to_rank == sched.stage_to_rank and back.num_microbatches == 4


def test_csv_with_torch_idle_cells(tmp_path):
    path = tmp_path / "idle.csv"
    path.write_text("0F0,,0B0\n,1F0,1B0\n")
    sched = schedules.from_csv(path)
    assert [str(a) for a in sched.compute_only().actions[1]] == ["1F0", "1B0"]


def test_csv_names_a_duplicate_as_written(tmp_path):
    path = tmp_path / "dup.csv"
    path.write_text("0F0,0F1,0B0,0B1\n1F0,1F1,1F1,1B0,1B1\n")
    with pytest.raises(ScheduleError, match=r"rank 1 step 1 \(1F1\): 1F1 appears 2 times"):
        schedules.from_csv(path)


def test_csv_that_is_not_utf8_text_is_one_error_and_a_byte_order_mark_is_read_past(tmp_path):
    path = tmp_path / "binary.csv"
    path.write_bytes(b"0F0,0B0\n\xff\xfe1F0,1B0\n")
    with pytest.raises(ScheduleError, match=r"binary.csv is not UTF-8 text \(byte 8: invalid start byte\)"):
        schedules.from_csv(path)
    bom = tmp_path / "bom.csv"
    bom.write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", encoding="utf-8-sig")
    assert schedules.from_csv(bom).actions == schedules.build("1f1b", 2, 2).actions


def _before_reduce_grad(rows: list[list[str]]) -> dict[str, str]:
    """For each ``{stage}REDUCE_GRAD``, the stage's own action right before it (receives,
    which torch's lowering and ppx place differently, skipped)."""
    out = {}
    for row in rows:
        for k, cell in enumerate(row):
            if cell.endswith("REDUCE_GRAD"):
                stage = cell[: -len("REDUCE_GRAD")]
                out[cell] = next(c for c in reversed(row[:k]) if "RECV" not in c and c.startswith(stage))
    return out


@pytest.mark.parametrize(
    ("name", "p", "m", "v"), [("1f1b", 3, 4, None), ("zb_h1", 3, 4, None), ("interleaved_1f1b", 2, 4, 2)]
)
def test_reduce_grad_goes_where_torch_puts_it(name, p, m, v):
    # after the stage's last backward *and its gradient send*: before the send, torch's
    # executor would make the send wait for the reduction
    from torch.distributed.pipelining.schedules import _Action, _add_reduce_grad, _add_send_recv

    from ppx.schedules.csv_io import torch_rows

    sched = schedules.build(name, p, m, v)
    compute = {r: [_Action.from_str(str(a)) for a in row] for r, row in enumerate(sched.compute_only().actions)}
    lowered = _add_send_recv(
        {r: _add_reduce_grad(row, m) for r, row in compute.items()},
        stage_to_rank=lambda s: sched.stage_to_rank[s],
        num_stages=sched.num_stages,
    )
    theirs = _before_reduce_grad([[str(a) for a in lowered[r]] for r in sorted(lowered)])
    ours = _before_reduce_grad(torch_rows(sched))
    assert ours == theirs
    if name == "1f1b":
        assert ours == {"0REDUCE_GRAD": "0B3", "1REDUCE_GRAD": "1SEND_B3", "2REDUCE_GRAD": "2SEND_B3"}


def test_every_familys_list_adds_gradients_in_microbatch_order_and_a_csv_may_not(tmp_path):
    """`gradients_out_of_order`: none of the families' lists (nor their drained ones) adds a
    stage's gradients of a microbatch after a later one's; a CSV that runs a B, or an I (which
    adds the small weights' gradients under a split that stores), of a later microbatch first does."""
    from ppx.schedules.auto.auto_zb import auto_zb
    from ppx.schedules.ir.structure import drain_only, gradients_out_of_order
    from ppx.schedules.sim.costs import Costs

    for name, fam in schedules.FAMILIES.items():
        v = 2 if fam.virtual or fam.default_virtual == 2 else 1
        for p, m in ((2, 4), (4, 8)):
            built = schedules.build(name, p, m, v)
            assert gradients_out_of_order(built) is None and gradients_out_of_order(drain_only(built)) is None, name
    for costs in (Costs(fwd=1, bwd=1, wgrad=1), Costs(fwd=[1, 2, 1], bwd=[2, 1, 1], wgrad=[0.5, 2, 1])):
        for limit in (None, 6):  # (zb_auto: W's filling idle time, held back on later ranks)
            assert gradients_out_of_order(auto_zb(3, 6, costs, mem_limit=limit)) is None, (costs, limit)
    cases = {
        "0F0,0F1,0B0,0B1\n1F0,1I0,1F1,1B1,1W0\n": (1, 0, 1),  # W0 after B1
        "0F0,0F1,0B0,0B1\n1F0,1F1,1I1,1I0,1W0,1W1\n": (1, 0, 1),  # I0 after I1, the W's in order
        "0F0,0F1,0B1,0B0\n1F0,1B0,1F1,1B1\n": (0, 0, 1),
        "0F0,0F1,0B0,0B1\n1F0,1I0,1F1,1I1,1W0,1W1\n": None,
    }
    for text, want in cases.items():
        path = tmp_path / "mine.csv"
        path.write_text(text)
        assert gradients_out_of_order(schedules.from_csv(path)) == want, text
