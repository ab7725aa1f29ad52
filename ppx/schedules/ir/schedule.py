"""The `Schedule` container: per-rank ordered action lists plus the stage-to-rank map."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ppx.schedules.ir.action import Action, Op, overlap_string
from ppx.units import count


@dataclass(frozen=True)
class Schedule:
    """A complete pipeline schedule.

    ``actions[r]`` is rank r's ordered action list. A schedule function returns compute
    actions only (F, B, I, W); `ppx.schedules.comms.lowering.add_comms` inserts the sends and
    receives they imply. ``stage_to_rank[s]`` is the rank that owns stage s (several stages
    per rank for interleaved schedules).
    """

    name: str
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    actions: tuple[tuple[Action, ...], ...]
    training: bool = True
    # Optional, per rank: sizes of the consecutive runs of compute actions whose sends and
    # receives go out together (Megatron's interleaved steady state batches a forward and a
    # backward). None: every compute action is its own group.
    groups: tuple[tuple[int, ...], ...] | None = None
    # Optional, per rank: overlapped cells (torch's OVERLAP_F_B), as the indices k among the
    # rank's compute actions where the k-th (a forward) and the (k+1)-th (a backward of
    # another microbatch) form one cell: their inputs are awaited together, their outputs
    # sent together, and on CUDA they run on two streams at once. None: no cells.
    overlaps: tuple[frozenset[int], ...] | None = None

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    @property
    def num_stages(self) -> int:
        return len(self.stage_to_rank)

    @property
    def splits_backward(self) -> bool:
        """Whether any backward is split into an I and a W (zero bubble's way)."""
        return any(a.op is Op.I for row in self.actions for a in row)

    @property
    def stages_per_rank(self) -> int:
        """v: stages per rank (interleaved schedules place v on each rank; others 1)."""
        return self.num_stages // self.num_ranks

    def stages_held(self) -> list[int]:
        """How many stages each rank holds (a CSV may hold them unevenly)."""
        return [len(self.stages_of(r)) for r in range(self.num_ranks)]

    def holding(self) -> str:
        """'2 stages on each rank', or 'its stages unevenly (rank 0 1, rank 1 2)'."""
        held = self.stages_held()
        if len(set(held)) == 1:
            return f"{count(held[0], 'stage')} on each rank"
        return "its stages unevenly (" + ", ".join(f"rank {r} {n}" for r, n in enumerate(held)) + ")"

    def cells(self, rank: int) -> frozenset[int]:
        """Rank ``rank``'s overlapped cells: compute indices k where actions k and k+1 form one."""
        return self.overlaps[rank] if self.overlaps else frozenset()

    def stages_of(self, rank: int) -> list[int]:
        return [s for s, r in enumerate(self.stage_to_rank) if r == rank]

    def with_actions(self, actions) -> Schedule:
        return replace(self, actions=tuple(tuple(a) for a in actions))

    def compute_only(self) -> Schedule:
        return self.with_actions([[a for a in row if a.op.is_compute] for row in self.actions])

    def format(self) -> str:
        """One line per rank: ``rank 0: 0F0 0SEND_F0 ... (0F3;3B1)OVERLAP_F_B ...``."""
        return "\n".join(f"rank {r}: " + " ".join(self.strings(r)) for r in range(self.num_ranks))

    def units(self, rank: int) -> list[tuple[Action, ...]]:
        """Rank ``rank``'s actions in the units that run whole: one action, or an overlapped
        cell's two."""
        cells, row, out = self.cells(rank), self.actions[rank], []
        j = n = 0  # position in the row, compute actions so far
        while j < len(row):
            width = 2 if row[j].op.is_compute and n in cells else 1
            out.append(tuple(row[j : j + width]))
            n += sum(a.op.is_compute for a in out[-1])
            j += width
        return out

    def strings(self, rank: int) -> list[str]:
        """Rank ``rank``'s actions as torch writes them, an overlapped cell as one
        ``(0F3;3B1)OVERLAP_F_B``."""
        return [overlap_string(*u) if len(u) == 2 else str(u[0]) for u in self.units(rank)]
