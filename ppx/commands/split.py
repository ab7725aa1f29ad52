"""`ppx split`: how a config splits its model's units over the stages, before any run: each
stage's rank, units and share of the forward FLOPs, and the split the other
``pipeline.balance`` would make. The config as given (a run on CPU may fall back to another:
``runtime.cpu_fallback``)."""

from __future__ import annotations


def cmd_split(args) -> int:
    from ppx import config, models
    from ppx.config import resolve_schedule
    from ppx.report.units_line import flops_shares, units_line

    cfg = config.load(args.experiment, args.overrides)
    sched = resolve_schedule(cfg)
    units = [len(r) for r in models.split_of(cfg, sched.num_stages)]
    shares = flops_shares(cfg, units)
    names = _unit_names(cfg, sum(units))
    received = _received(cfg, sched.num_stages)
    print(f"{args.experiment}: {sum(units)} units over {sched.num_stages} stages on {sched.num_ranks} ranks")
    print(f"{'stage':>5}  {'rank':>4}  {'FLOPs':>6}  units")
    start = 0
    for s, n in enumerate(units):
        share = f"{shares[s]:.0%}" if shares else "-"
        held = names[start] if n == 1 else f"{names[start]} .. {names[start + n - 1]} ({n})"
        got = f"; receives {received[s - 1]} a microbatch" if received and s else ""
        print(f"{s:>5}  {sched.stage_to_rank[s]:>4}  {share:>6}  {held}{got}")
        start += n
    line = units_line(cfg, units, shares)
    even = "split evenly (pipeline.balance weighs the units of llama, hf and module models only)"
    if cfg.model.kind in models.WEIGHED:  # (its units' FLOPs could not be counted, or all are 0)
        even = "split evenly (no unit's forward FLOPs counted: a unit that cannot run on the meta device, or no matmul)"
    if cfg.pipeline.layers_per_stage:  # (an explicit split is no one's evening)
        even = "as pipeline.layers_per_stage gives"
    print(line.removeprefix("ppx: ") if line else f"units per stage {', '.join(map(str, units))}: {even}")
    if shares and not cfg.pipeline.layers_per_stage:
        other = "units" if cfg.pipeline.balance == "flops" else "flops"
        cfg.pipeline.balance = other
        alt = [len(r) for r in models.split_of(cfg, sched.num_stages)]
        said = ", ".join(f"{x:.0%}" for x in flops_shares(cfg, alt))
        print(f"pipeline.balance={other} would split {', '.join(map(str, alt))}: forward FLOPs per stage {said}")
    return 0


def _unit_names(cfg, n: int) -> list[str]:
    """Each split unit's name: llama's and hf's embedding, blocks and head; a module's own
    names; other kinds' blocks."""
    from ppx import models

    if cfg.model.kind == "module":
        from ppx.models import module_spec

        return module_spec.described(cfg.model)[1]
    if models.extra_units(cfg.model.kind) == 2:  # (hf's decoder layers, llama's blocks)
        block = "layer" if cfg.model.kind == "hf" else "block"
        return ["embedding"] + [f"{block} {k}" for k in range(n - 2)] + ["head"]
    return [f"block {k}" for k in range(n)]


def _received(cfg, num_stages: int) -> list[str]:
    """What each stage but the first receives a microbatch (shape, dtype as it travels, bytes),
    for a model whose units hand on different shapes (your module's: `models.handed_on`); []
    for the others, whose stages all receive one shape (and no torch imported for it)."""
    from ppx import models

    if not hasattr(models.kind(cfg.model.kind), "unit_outputs"):
        return []
    import torch

    from ppx.engine.precision import Precision
    from ppx.units import format_bytes

    travels = Precision(cfg.train.dtype, "cpu").boundary_dtype
    mbs = cfg.microbatch_size()
    out = []
    for shape, dtype in models.handed_on(cfg, num_stages, mbs):
        dtype = travels(dtype)
        size = torch.Size(shape).numel() * dtype.itemsize
        out.append(f"{tuple(shape)} {str(dtype).removeprefix('torch.')}, {format_bytes(size)}")
    return out
