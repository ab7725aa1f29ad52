"""DualPipeV (DeepSeek's DualPipe "cut in half", github.com/deepseek-ai/DualPipe), in
torch.distributed.pipelining's order (`ScheduleDualPipeV`): each of p ranks holds two stages in
V placement (stage s on rank s for s < p, on rank 2p-1-s after), and in the steady state runs a
forward of one of its stages together with a full backward of the other as one overlapped
cell (torch's OVERLAP_F_B; `Schedule.overlaps`). The warmup and the drain split some
backwards into I and W, the W's waiting in a queue for the slots the drain leaves.

Rank r, first stage r, second 2p-1-r (the counts are DeepSeek's and torch's):
1. 2(p-r-1) forwards of the first stage;
2. r+1 pairs of forwards (first stage, second);
3. p-r-1 triples on the second stage: I, the oldest queued W, F;
4. m-2p+r+1 pairs of cells: (F first; B second), then (F second; B first); on the last rank
   the first of these is not overlapped (F, then B) to shorten the bubble;
5. p-r-1 times: B second, then the cell (F second; B first);
6. r+1 pairs of backwards (second, first), full ones up to the middle pair, I's from there
   (on odd ranks from its second stage's, on even ranks from its first stage's);
7. p-r-1 times: the oldest queued W, then an I of the first stage;
8. the r+1 W's still queued.

It needs m >= 2p microbatches (step 4 runs at least once on every rank); torch refuses fewer.
"""

from __future__ import annotations

from collections import defaultdict, deque

from ppx.errors import ScheduleError
from ppx.schedules.families.zbv import v_stage_to_rank
from ppx.schedules.ir.action import Action, B, F, I, W
from ppx.schedules.ir.schedule import Schedule


def shape_error(p: int, m: int, v: int = 2) -> str | None:
    """Why dualpipev cannot take (p, m): it needs m >= 2p, as torch's ScheduleDualPipeV."""
    if m < 2 * p:
        return (
            f"dualpipev needs pipeline.microbatches >= 2 x pipeline.stages = {2 * p} (one per stage of its V, "
            f"as torch's ScheduleDualPipeV), got {m}"
        )
    return None


def dualpipev(p: int, m: int) -> Schedule:
    why = shape_error(p, m)
    if why:
        raise ScheduleError(why)
    rows, cells = zip(*(_rank(p, m, r) for r in range(p)))
    return Schedule("dualpipev", m, v_stage_to_rank(p), tuple(rows), overlaps=tuple(cells))


def _rank(p: int, m: int, r: int) -> tuple[tuple[Action, ...], frozenset[int]]:
    """Rank r's compute actions and its cells (the compute indices k where k and k+1 form one)."""
    first, second = r, 2 * p - 1 - r
    fwd: dict[int, int] = defaultdict(int)  # stage -> its next forward's microbatch
    bwd: dict[int, int] = defaultdict(int)  # stage -> its next backward's (B or I) microbatch
    queue: deque[Action] = deque()  # I's whose W has not run, oldest first
    row: list[Action] = []
    cells: set[int] = set()

    def f(stage: int) -> None:
        row.append(F(stage, fwd[stage]))
        fwd[stage] += 1

    def b(stage: int, split: bool = False) -> None:
        row.append((I if split else B)(stage, bwd[stage]))
        bwd[stage] += 1
        if split:
            queue.append(row[-1])

    def w() -> None:
        if queue:
            a = queue.popleft()
            row.append(W(a.stage, a.mb))

    def cell(f_stage: int, b_stage: int) -> None:
        cells.add(len(row))
        f(f_stage)
        b(b_stage)

    for _ in range(2 * (p - r - 1)):  # 1
        f(first)
    for _ in range(r + 1):  # 2
        f(first)
        f(second)
    for _ in range(p - r - 1):  # 3
        b(second, split=True)
        w()
        f(second)
    for i in range(m - 2 * p + r + 1):  # 4
        if i == 0 and r == p - 1:
            f(first)
            b(second)
        else:
            cell(first, second)
        cell(second, first)
    for _ in range(p - r - 1):  # 5
        b(second)
        cell(second, first)
    split = False
    for i in range(r + 1):  # 6
        split |= i == (r + 1) // 2 and r % 2 == 1
        b(second, split)
        split |= i == (r + 1) // 2 and r % 2 == 0
        b(first, split)
    for _ in range(p - r - 1):  # 7
        w()
        b(first, split=True)
    for _ in range(r + 1):  # 8
        w()
    return tuple(row), frozenset(cells)
