"""The one place that knows schedule names: ppx's families, torch.distributed.pipelining's
aliases, each family's default stages per rank v and its shape rules (such as interleaved's
m % p). Adding a schedule = one pure function in this package + one `Family` entry here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ppx.errors import ScheduleError
from ppx.schedules.comms.lowering import add_comms
from ppx.schedules.families.basic import forward_only, gpipe, naive, one_f_one_b
from ppx.schedules.families.dualpipev import dualpipev
from ppx.schedules.families.dualpipev import shape_error as dualpipev_shape_error
from ppx.schedules.families.interleaved import interleaved_1f1b
from ppx.schedules.families.interleaved import shape_error as interleaved_shape_error
from ppx.schedules.families.interleaved_zb import interleaved_zb
from ppx.schedules.families.interleaved_zb import shape_error as interleaved_zb_shape_error
from ppx.schedules.families.looped_bfs import looped_bfs
from ppx.schedules.families.zbv import zbv
from ppx.schedules.families.zero_bubble import zb_h1, zb_h2
from ppx.schedules.ir.schedule import Schedule
from ppx.schedules.ir.structure import drain_only
from ppx.schedules.placing.placement import place_comms
from ppx.schedules.sim.costs import Costs
from ppx.schedules.sim.simulate import simulate


@dataclass(frozen=True)
class Family:
    """A named schedule: its pure builder (p, m, v), its theoretical bubble (share of the
    step that is idle, with equal per-stage costs) and a one-line summary."""

    name: str
    make: Callable[[int, int, int], Schedule]
    bubble: Callable[[int, int, int], float]
    bubble_formula: str
    summary: str
    virtual: bool = False  # accepts any pipeline.virtual_stages; else only default_virtual
    default_virtual: int = 1  # v when pipeline.virtual_stages is null (2 for the V placements)
    shape_rule: Callable[[int, int, int], str | None] | None = None  # (p, m, v) -> why not, or None

    def shape_error(self, p: int, m: int, v: int) -> str | None:
        """Why (p, m, v) is not a shape of this family, or None."""
        return self.shape_rule(p, m, v) if self.shape_rule else None


def _fill_drain(p: int, m: int, v: int = 1) -> float:
    return (p - 1) / (m + p - 1)


def _zb_h1_bubble(p: int, m: int, v: int = 1) -> float:
    """ZB-H1's idle share with t_f = t_b = t_w: (p-1)/(3m+p-1) once m >= p (simulated, so
    it also holds for m < p)."""
    return simulate(add_comms(zb_h1(p, m)), Costs(fwd=1, bwd=1, wgrad=1)).bubble_fraction()


def own_bubble(schedule: Schedule, costs: Costs) -> float:
    """The idle share of a compute order's own timing: the simulator at zero communication,
    every request on its own and every receive posted up front (gloo's way), so that no
    placement of the sends and receives adds waits of its own."""
    return simulate(add_comms(schedule), costs, "gloo", -1).bubble_fraction()


def _zb_h2_bubble(p: int, m: int, v: int = 1) -> float:
    """ZB-H2's idle share with t_f = t_b = t_w. For m >= 2p-1, from the paper's closed form:
    (p-1)(T_F+T_B-2T_W) = 0 idle inside every rank's span, which a synchronous step extends
    by the parallelogram's skew (rank r starts r slots late and ends p-1-r slots early), so
    p-1 slots per rank: (p-1)/(3m+p-1). Fewer microbatches: simulated."""
    if m >= 2 * p - 1:
        return (p - 1) / (3 * m + p - 1)
    return own_bubble(zb_h2(p, m), Costs(fwd=1, bwd=1, wgrad=1))


def _looped_bfs_bubble(p: int, m: int, v: int = 2) -> float:
    """Looped BFS's idle share, simulated (any t_b / t_f): (p-1)/(vm+p-1) for m >= p, as
    GPipe's over v times the work; for m < p every loop also waits p-m slots."""
    return own_bubble(looped_bfs(p, m, v), Costs(fwd=1, bwd=1))


def _interleaved_zb_bubble(p: int, m: int, v: int = 2) -> float:
    """Interleaved zero bubble's idle share with t_f = t_b = t_w, simulated: (p-1)/(3vm+p-1)
    for m >= p, ZB-H1's with v m for m; more for m < p."""
    return own_bubble(interleaved_zb(p, m, v), Costs(fwd=1, bwd=1, wgrad=1))


def _zbv_bubble(p: int, m: int, v: int = 2) -> float:
    """ZB-V's idle share with t_f = t_b = t_w per stage. For m >= 2p-1, from the authors' closed
    form: zero bubble with T_F = T_B = T_W (no rank idles between its first action and its
    last), which a synchronous step extends by the skew (rank r starts r slots late and ends
    p-1-r slots before the last): p-1 slots per rank besides its 6m, (p-1)/(6m+p-1). Fewer
    microbatches (torch's order built for 2p-1, the extra ones dropped): simulated."""
    if m >= 2 * p - 1:
        return (p - 1) / (6 * m + p - 1)
    return own_bubble(zbv(p, m), Costs(fwd=1, bwd=1, wgrad=1))


def dualpipe_bubble(p: int, fb: float, b: float, w: float) -> float:
    """DualPipe's closed form for DualPipeV on p ranks (2p stages): (PP/2-1)(F&B+B-3W) with
    PP = 2p, the longest rank's idle time between its first action and its last; ``fb`` an
    overlapped cell's time, ``b`` a full backward's, ``w`` a weight pass's."""
    return (p - 1) * (fb + b - 3 * w)


def _dualpipev_bubble(p: int, m: int, v: int = 2) -> float:
    """DualPipeV's idle share with t_f = t_b = t_w per stage, from DualPipe's closed form: with
    F = W = 1, a full B = 2 and a cell F&B = F + B = 3 (ppx's clock: a cell's parts one after
    the other), 2(p-1) idle slots on rank 0, which starts first and ends last; every rank does
    2m (F + B) = 6m, so the step is 6m + 2(p-1) and the idle share 2(p-1)/(6m+2(p-1)) =
    (p-1)/(3m+p-1)."""
    idle = dualpipe_bubble(p, 1 + 2, 2, 1)
    return idle / (2 * m * (1 + 2) + idle)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "naive",
            lambda p, m, v: naive(p, m),
            lambda p, m, v=1: (p - 1) / p,
            "(p-1)/p",
            "one microbatch at a time through all stages, stop-and-wait",
        ),
        Family("gpipe", lambda p, m, v: gpipe(p, m), _fill_drain, "(p-1)/(m+p-1)", "all forwards, then all backwards"),
        Family(
            "1f1b",
            lambda p, m, v: one_f_one_b(p, m),
            _fill_drain,
            "(p-1)/(m+p-1)",
            "warmup forwards, one-forward-one-backward, cooldown",
        ),
        Family(
            "forward_only",
            lambda p, m, v: forward_only(p, m),
            _fill_drain,
            "(p-1)/(m+p-1)",
            "forwards only (inference/evaluation)",
        ),
        Family(
            "interleaved_1f1b",
            interleaved_1f1b,
            lambda p, m, v=1: (p - 1) / (v * m + p - 1),
            "(p-1)/(vm+p-1)",
            "v stages per rank (Megatron virtual pipeline), 1F1B over model chunks",
            virtual=True,
            default_virtual=2,
            shape_rule=interleaved_shape_error,
        ),
        Family(
            "zb_h1",
            lambda p, m, v: zb_h1(p, m),
            _zb_h1_bubble,
            "(p-1)/(3m+p-1) for m >= p, t_f = t_b = t_w (simulated)",
            "1F1B with the backward split into I and W, W deferred into the bubbles",
        ),
        Family(
            "zb_h2",
            lambda p, m, v: zb_h2(p, m),
            _zb_h2_bubble,
            "(p-1)/(3m+p-1) for m >= 2p-1, t_f = t_b = t_w (closed form; fewer m: simulated)",
            "zero bubble ZB-H2: more warmup forwards, W's held back into the drain, 2p-1 in flight",
        ),
        Family(
            "looped_bfs",
            looped_bfs,
            _looped_bfs_bubble,
            "(p-1)/(vm+p-1) for m >= p (simulated)",
            "v stages per rank, breadth first (torch's LoopedBFS): GPipe over the model chunks",
            virtual=True,
            default_virtual=2,
        ),
        Family(
            "interleaved_zb",
            interleaved_zb,
            _interleaved_zb_bubble,
            "(p-1)/(3vm+p-1) for m >= p, t_f = t_b = t_w (simulated)",
            "v stages per rank, interleaved 1F1B with I and W (torch's InterleavedZeroBubble, ZB1P)",
            virtual=True,
            default_virtual=2,
            shape_rule=interleaved_zb_shape_error,
        ),
        Family(
            "zbv",
            lambda p, m, v: zbv(p, m),
            _zbv_bubble,
            "(p-1)/(6m+p-1) for m >= 2p-1, t_f = t_b = t_w (closed form; fewer m: simulated)",
            "zero bubble V (torch's ZBVZeroBubble): two stages per rank in a V, I and W, 1F1B's memory",
            default_virtual=2,
        ),
        Family(
            "dualpipev",
            lambda p, m, v: dualpipev(p, m),
            _dualpipev_bubble,
            "(p-1)/(3m+p-1) for t_f = t_b = t_w, a cell F + B (DualPipe's (PP/2-1)(F&B+B-3W), PP = 2p; closed form)",
            "DualPipe cut in half (torch's DualPipeV): two stages per rank in a V, forward and backward in cells",
            default_virtual=2,
            shape_rule=dualpipev_shape_error,
        ),
    ]
}

# torch.distributed.pipelining's schedules -> (the ppx family whose list describes the same
# order, the class in torch.distributed.pipelining that runs it)
TORCH_SCHEDULES = {"torch_gpipe": "gpipe", "torch_1f1b": "1f1b", "torch_interleaved1f1b": "interleaved_1f1b"}
TORCH_CLASSES = {
    "torch_gpipe": "ScheduleGPipe",
    "torch_1f1b": "Schedule1F1B",
    "torch_interleaved1f1b": "ScheduleInterleaved1F1B",
}


def _torch_1f1b_shape_error(p: int, m: int, v: int) -> str | None:
    """torch's Schedule1F1B refuses fewer microbatches than stages (where ppx's 1F1B runs them)."""
    if m < p:
        return f"needs pipeline.microbatches ({m}) >= pipeline.stages ({p}), as torch's Schedule1F1B refuses fewer"
    return None


TORCH_SHAPE_RULES = {"torch_1f1b": _torch_1f1b_shape_error}  # torch's own, beside its family's


def names() -> tuple[str, ...]:
    """Every schedule name: ppx's families, then torch's."""
    return (*FAMILIES, *TORCH_SCHEDULES)


def names_help() -> str:
    """'naive | gpipe | ... | torch_interleaved1f1b', for help texts."""
    return " | ".join(names())


def virtual_help() -> str:
    """pipeline.virtual_stages' help: the families that take several stages per rank, and where
    they place them (from `FAMILIES`, so a new family is listed without a schema edit)."""
    looped = ", ".join(f.name for f in FAMILIES.values() if f.virtual)
    v_shaped = ", ".join(f.name for f in FAMILIES.values() if not f.virtual and f.default_virtual == 2)
    defaults = sorted({f.default_virtual for f in FAMILIES.values() if f.default_virtual != 1})
    return (
        f"stages per rank v for schedules that take several ({looped}: stage s on rank s % stages; "
        f"{v_shaped}: exactly 2, in a V: stage s on rank s, then on rank 2 x stages - 1 - s); null: the "
        f"schedule's default ({', '.join(map(str, defaults))} for those, else 1); a CSV schedule sets its "
        "own (null or that count)"
    )


def is_csv(name: str) -> bool:
    """Whether ``name`` names a schedule CSV (``mine.csv``, ``MINE.CSV``)."""
    return name.lower().endswith(".csv")


def is_torch(name: str) -> bool:
    """True for torch.distributed.pipelining's own schedules (run by torch's executor)."""
    return name in TORCH_SCHEDULES


def runs_on_torch(name: str, executor: str) -> bool:
    """True when torch's runtime executes the schedule: a torch_* schedule, or executor=torch."""
    return is_torch(name) or executor == "torch"


def family_name(name: str) -> str:
    """The ppx family of ``name``: itself, or for a torch schedule the ppx list of its order."""
    return TORCH_SCHEDULES.get(name, name)


def family(name: str) -> Family:
    """The family of ``name`` (torch aliases included); ScheduleError for an unknown name."""
    try:
        return FAMILIES[family_name(name)]
    except KeyError:
        file = "/" in name or "." in name  # (a path: a schedule file's name ends in .csv)
        raise ScheduleError(
            f"unknown schedule {name!r}; choose from {', '.join(FAMILIES)}, "
            f"or torch.distributed.pipelining's {', '.join(TORCH_SCHEDULES)}"
            + (", or a schedule CSV, a file whose name ends in .csv" if file else "")
        ) from None


def default_virtual(name: str) -> int:
    """Stages per rank when none is given: the family's default (2 for interleaved), else 1."""
    fam = formula_family(name)
    return fam.default_virtual if fam else 1


MAX_STAGE_MICROBATCHES = 2**18  # a list's stages x microbatches: 100 ranks x 1000 microbatches take 1.6 s


def build(
    name: str, stages: int, microbatches: int, virtual_stages: int | None = None, transport: str = "nccl"
) -> Schedule:
    """The validated schedule ``name`` (a family or a torch alias) for ``stages`` ranks,
    ``microbatches`` and ``virtual_stages`` stages per rank (None: the default), with comms
    placed to run under ``transport`` ("nccl", the strict one, or "gloo")."""
    v = default_virtual(name) if virtual_stages is None else virtual_stages
    if stages < 1 or microbatches < 1 or v < 1:
        raise ScheduleError(f"stages ({stages}), microbatches ({microbatches}) and virtual stages ({v}) must be >= 1")
    fam = family(name)
    if why := virtual_stages_error(name, v):
        raise ScheduleError(why)
    why = fam.shape_error(stages, microbatches, v)
    if why:  # (a torch alias checks its family's list: both named)
        raise ScheduleError(why if fam.name == name else f"{name} (as {fam.name}): {why}")
    if name in TORCH_SHAPE_RULES and (why := TORCH_SHAPE_RULES[name](stages, microbatches, v)):
        raise ScheduleError(f"{name} {why}")
    too_large = size_error(stages, v, microbatches)
    if too_large:
        raise ScheduleError(too_large)
    return place_comms(fam.make(stages, microbatches, v), transport)


def size_error(ranks: int, v: int, microbatches: int) -> str | None:
    """Why a list of ``ranks`` x ``v`` stages x ``microbatches`` is too large to build, or None."""
    return too_many(ranks * v, microbatches, f"{ranks} ranks x {v} stages x {microbatches} microbatches")


def too_many(stages: int, microbatches: int, shape: str) -> str | None:
    """Why a list of ``stages`` (all ranks') x ``microbatches`` is too large to build (``shape``:
    how the message names them), or None."""
    n = stages * microbatches
    if n <= MAX_STAGE_MICROBATCHES:
        return None
    return (
        f"{shape} = {n} stage-microbatches: ppx builds lists of at most {MAX_STAGE_MICROBATCHES} (up to about 15 "
        "s of building and checking on 2 cores)"
    )


def virtual_stages_error(name: str, v: int) -> str | None:
    """Why ``v`` stages per rank is not a shape of schedule ``name``, which takes one count of
    its own (one stage per rank, or a V's two), or None."""
    fam = family(name)
    return _fixed_virtual_error(name, fam, v) if v != fam.default_virtual and not fam.virtual else None


def _fixed_virtual_error(name: str, fam: Family, v: int) -> str:
    """Why ``v`` stages per rank is not a shape of ``fam``, which takes only its own."""
    if fam.default_virtual != 1:
        return (
            f"schedule {name!r} places exactly {fam.default_virtual} stages on every rank, in a V (stage s on "
            f"rank s, then on rank 2p-1-s): pipeline.virtual_stages must be {fam.default_virtual} or null (got {v})"
        )
    several = ", ".join(f.name for f in FAMILIES.values() if f.virtual)
    v_shaped = " and ".join(f.name for f in FAMILIES.values() if not f.virtual and f.default_virtual != 1)
    return (
        f"schedule {name!r} runs one stage per rank: pipeline.virtual_stages must be 1 "
        f"(got {v}); {several} take several" + (f", {v_shaped} two in a V" if v_shaped else "")
    )


def formula_family(name: str) -> Family | None:
    """The family whose closed form describes schedule ``name`` (torch's via the ppx list of
    the same order), or None (a CSV schedule)."""
    return FAMILIES.get(family_name(name))


def theory_bubble(name: str, stages: int, microbatches: int, virtual_stages: int = 1) -> float | None:
    """Theoretical bubble as a share of the step (equal stage costs), or None for schedules
    without a formula and shapes the schedule does not take."""
    fam = formula_family(name)
    if fam is None or fam.shape_error(stages, microbatches, virtual_stages):
        return None
    return fam.bubble(stages, microbatches, virtual_stages)


def drained(schedule: Schedule, transport: str = "nccl") -> Schedule:
    """``schedule`` as ``train.split_backward=drain`` runs it (`drain_only`), its sends and
    receives placed again for that order under ``transport`` (those of the list it came from
    were chosen for another order: on NCCL interleaved_zb's drained list ran at 14.3% bubble
    where its own placement runs it at 11.1%); ``schedule`` itself where drain changes nothing."""
    out = drain_only(schedule)
    if out.actions == schedule.actions:
        return schedule
    return place_comms(out.compute_only(), transport)
