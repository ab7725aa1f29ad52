"""`ppx schedule`: a schedule's rank x time grid, its bubble, its actions and its CSV."""

from __future__ import annotations

from ppx.commands.common import drain_list, output_path, schedule_from
from ppx.errors import UserError
from ppx.schedules.ir.action import Op
from ppx.schedules.ir.structure import drain_keeps
from ppx.schedules.ir.sum_order import out_of_order_note


def _has_comms(path: str) -> bool:
    """Whether the CSV at ``path`` places its own sends and receives."""
    from ppx import schedules

    return any(a.op.is_comm for row in schedules.read_csv(path).actions for a in row)


def _own_order(has_comms: bool, sched, costs, transport: str) -> str:
    """For a CSV: the bubble of its compute order with ppx's placement, beside the one of its
    own sends and receives when it has them (``has_comms``: early receives can hold a rank
    back on NCCL)."""
    from ppx import schedules
    from ppx.schedules.placing.placement import place_comms

    if not has_comms:
        return " (a CSV order: no theory; this is its own bubble)"
    own = schedules.simulate(place_comms(sched.compute_only(), transport), costs, transport).bubble_fraction()
    return (
        f" with the CSV's own sends and receives on {transport}; {own:.1%} with ppx's placement of the same "
        "compute order (its own bubble; a CSV order has no theory)"
    )


def cmd_schedule(args) -> int:
    from ppx import schedules
    from ppx.schedules.grid import render_grid

    output_path("--csv", args.csv)
    if args.with_comms and not args.csv:
        raise UserError("--with-comms only shapes the --csv file; add --csv FILE (or use --actions to print comms)")

    if args.fwd < 1 or args.bwd < 1 or args.wgrad is not None and args.wgrad < 0:
        raise UserError(
            f"--fwd and --bwd must be >= 1 grid slot and --wgrad >= 0 (got {args.fwd}, {args.bwd}, {args.wgrad})"
        )
    sched = schedule_from(args.name, args.stages, args.microbatches, args.virtual, args.transport)
    full = sched
    if args.drain:
        sched = drain_list(sched, args.transport)
    own_comms = schedules.is_csv(args.name) and _has_comms(args.name)  # (read before --csv may write over it)
    with_comms = _write_csv(args, sched) if args.csv else False
    if args.wgrad is None:  # a split backward's W shows in the grid, as the theory (t_f = t_b = t_w) counts it
        args.wgrad = int(any(a.op is Op.W for row in sched.actions for a in row))
    args.virtual = sched.stages_per_rank
    costs = schedules.Costs(fwd=args.fwd, bwd=args.bwd, wgrad=args.wgrad)
    p, m = sched.num_ranks, sched.num_microbatches
    b = args.bwd + args.wgrad
    print(
        f"{sched.name}: {p} ranks, {sched.num_stages} stages, {m} microbatches "
        f"(F = {args.fwd:g} slot{'s' if args.fwd != 1 else ''}, B = {b:g} slot{'s' if b != 1 else ''}"
        + (f", I = {args.bwd:g}, W = {args.wgrad:g}" if args.wgrad else "")
        + ")"
    )
    s2r = list(sched.stage_to_rank)
    if sched.num_stages <= p and s2r != list(
        range(sched.num_stages)
    ):  # (the grid names no stage where a rank holds one)
        print(
            "stages on other ranks than their number: " + ", ".join(f"stage {s} on rank {r}" for s, r in enumerate(s2r))
        )
    print(render_grid(sched, costs, args.transport))
    timeline = schedules.simulate(sched, costs, args.transport)
    fam = schedules.formula_family(args.name)  # (a CSV has none, whatever its file is called)
    sim = timeline.bubble_fraction()
    line = f"bubble (idle share of the step): simulated {sim:.1%}"
    if schedules.is_csv(args.name):
        line += _own_order(own_comms, sched, costs, args.transport)
    drained = sched.actions != full.actions
    if drained:
        own = schedules.simulate(full, costs, args.transport).bubble_fraction()
        line += f" (split only where a W fills the drain; {own:.1%} with every backward split, as the family's list)"
    elif args.drain:
        line += " (drain leaves this list as built: " + drain_keeps(full) + ")"
    if fam is not None and not drained:
        th = fam.bubble(p, m, args.virtual)
        if abs(sim - th) < 5e-4:
            line += f", theory {fam.bubble_formula} = {th:.1%}; as a share of the ideal time: {th / (1 - th):.1%}"
        else:  # slots the formula does not assume: the simulation is these slots' theory
            line += (
                f", theory {fam.bubble_formula} = {th:.1%} at the equal costs it assumes; as a share of the ideal "
                f"time: simulated {sim / (1 - sim):.1%}, theory {th / (1 - th):.1%}"
            )
    print(line)
    disorder = out_of_order_note(sched)
    if disorder:
        print(f"note: {args.name} {disorder}")
    if args.actions:
        print(sched.format())
    if args.csv:
        note = (
            ""
            if with_comms == args.with_comms
            else f" with its SEND/RECV actions: {sched.name} batches sends with computes, which compute actions alone cannot say"
        )
        print(f"wrote {args.csv}{note}")
    return 0


def _write_csv(args, sched) -> bool:
    """``sched`` to ``--csv``, before anything is printed (a full disk, /dev/full, failed after
    the grid), whole or not at all; whether it went with its sends and receives."""
    from ppx import schedules

    with_comms = args.with_comms or sched.groups is not None
    try:  # (a disk that fills: said by the option, not in the OS's words alone)
        schedules.write_csv(sched if with_comms else sched.compute_only(), args.csv)
    except OSError as e:
        raise UserError(f"--csv {args.csv}: could not write it ({e.strerror or e})") from None
    return with_comms
