"""Your model's units run once in turn on a first microbatch, before any process starts
(``model.kind=module``): each unit's output (the shape ppx sends between stages), and the last
unit's output fit to the loss, each failure one line.

On the meta device (no memory, no compute), where the units run as they are; a unit, loss or
batch that does what meta cannot (reads a value: ``.item()``, ``nonzero``, a routing's
``bincount``, a tensor made on the CPU inside the forward) runs the whole chain again on the
CPU, on a model built there (one forward of one microbatch), so that it is checked all the same."""

from __future__ import annotations

import torch
from torch import nn

from ppx.errors import UserError, said, said_where


class _MetaCannot(Exception):
    """A unit, the loss or the batch did what the meta device cannot."""


def _meta_cannot(e: Exception, h) -> bool:
    from ppx.models.module_spec import meta_refused

    return isinstance(h, torch.Tensor) and h.device.type == "meta" and meta_refused(e)


def unit_shapes(cfg, microbatch_size: int, described: tuple | None = None) -> list[tuple[str, tuple, torch.dtype]]:
    """Each unit's output (name, shape, dtype) but the last's, from one run of a first
    microbatch through ``described`` (the model built on meta and its unit names,
    `module_spec.described`: built here when None), or through the model built on the CPU where
    meta cannot run it; a batch function that fails or gives another sample count, a unit that
    fails on what it is handed, a last output that does not fit ppx's loss, a ``model.loss_fn``
    that fails or gives more than one number, is one line."""
    return _run(cfg, microbatch_size, described)[0]


def moved_buffers(cfg, microbatch_size: int, described: tuple | None = None) -> set[str]:
    """The buffers (each under every name) the units' forward moves: in place, or a new tensor
    under the name (on the meta device, where values cannot be compared, those a kernel moves
    without bumping a version, BatchNorm's statistics, are missed), from the same run."""
    return _run(cfg, microbatch_size, described)[1]


_CHAINED: dict[tuple[str, int], tuple[list, set[str]]] = {}  # _run's, by model section and microbatch size


def _run(cfg, microbatch_size: int, described: tuple | None) -> tuple[list, set[str]]:
    """(`unit_shapes`, `moved_buffers`) of one run of the chain, once per model section and
    size in a process (the config's checks ask for both, and for the split's boundaries)."""
    key = (repr(cfg), microbatch_size)
    if key not in _CHAINED:
        _CHAINED[key] = _chain_run(cfg, microbatch_size, described)
    return _CHAINED[key]


def _chain_run(cfg, microbatch_size: int, described: tuple | None) -> tuple[list, set[str]]:
    from ppx.models import module_spec
    from ppx.models.module import whole

    model, names = described or module_spec.described(cfg)
    x, target = first_batch(cfg, microbatch_size)
    try:
        return _watched(cfg, model, names, x.to("meta"), target)
    except _MetaCannot:
        return _watched(cfg, whole(cfg, 0)[0], names, x, target)


def _watched(cfg, model: nn.Module, names: list[str], h, target) -> tuple[list, set[str]]:
    named = model.named_buffers(remove_duplicate=False)  # (a shared buffer under each of its names)
    before = {n: (b, b._version, b.clone() if b.device.type != "meta" else None) for n, b in named}
    shapes = _chain(cfg, model, names, h, target)
    now = dict(model.named_buffers(remove_duplicate=False))
    moved = {
        n
        for n, (b, version, values) in before.items()
        if now.get(n) is not b or b._version != version or values is not None and not torch.equal(b, values)
    }
    return shapes, moved


_RAN: dict[tuple[str, int], tuple | str] = {}  # forward_run's, by model section and microbatch size
CPU_RUN_MAX_BYTES = 2**31  # the weights the CPU builds to run a forward meta cannot (2 GiB)


def forward_run(cfg, microbatch_size: int, described: tuple | None = None) -> tuple[str | None, str | None] | str:
    """`module_forward.run_once` of your forward (one torch.fx cannot trace) on a first
    microbatch (seed 0, torch's generators given back), on the meta device, or on the CPU where
    meta cannot run it (control flow on a value) and the weights are no more than
    `CPU_RUN_MAX_BYTES`: (what it does besides calling its units in turn, the unit it calls
    with autograd off that trains), or why it could not be run. Once per model section and size
    in a process (the config's checks, then `ppx run`'s note)."""
    key = (repr(cfg), microbatch_size)
    if key not in _RAN:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            _RAN[key] = _forward_run(cfg, microbatch_size, described)
    return _RAN[key]


def _forward_run(cfg, microbatch_size: int, described: tuple | None) -> tuple[str | None, str | None] | str:
    from ppx.models import module_spec
    from ppx.models.module import whole
    from ppx.models.module_forward import run_once

    model, names = described or module_spec.described(cfg)
    x, _ = first_batch(cfg, microbatch_size)
    try:
        return run_once(model, names, x.to("meta"))
    except Exception as e:
        if not module_spec.meta_refused(e):
            return said(e)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if size > CPU_RUN_MAX_BYTES:
        return (
            f"the meta device cannot run it, and its weights ({size / 2**30:.1f} GiB) are too many to run it on the CPU"
        )
    try:
        return run_once(whole(cfg, 0)[0], names, x)
    except Exception as e:
        return said(e)


def first_batch(cfg, samples: int) -> tuple:
    """Step 0's (inputs, targets) of ``samples`` samples, checked (`batch_problem`)."""
    from ppx.models.module import make_batch

    where = f"model.batch_fn={cfg.batch_fn}" if cfg.batch_fn else f"model.data={cfg.data}"
    try:
        x, target = make_batch(cfg, 0, samples, 0)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"{where}: step 0's batch failed: {said_where(e)}") from None
    wrong = batch_problem(x, target, samples)
    if wrong:
        raise UserError(f"{where}: {wrong}")
    return x, target


def batch_problem(x, target, asked: int) -> str | None:
    """What is wrong with a batch function's (inputs, targets) for ``asked`` samples, or None:
    ppx splits both into microbatches along their first dimension, so the inputs are one tensor
    of ``asked`` samples and the targets one tensor of a multiple of them (a target per token,
    flattened, too)."""
    ok_x = isinstance(x, torch.Tensor) and x.dim() >= 1 and len(x) == asked
    rows = len(target) if isinstance(target, torch.Tensor) and target.dim() >= 1 else 0
    if ok_x and rows and rows % asked == 0:
        return None

    def of(t) -> str:
        return f"of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else f"a {type(t).__name__}"

    return (
        f"asked for {asked} samples (its batch_size argument), it gives inputs {of(x)} and targets "
        f"{of(target)}: ppx splits both into microbatches along the first dimension, so it needs the inputs as "
        f"one tensor of {asked} samples and the targets as one tensor of a multiple of {asked} rows"
    )


def _chain(cfg, model: nn.Module, names: list[str], h: torch.Tensor, target) -> list[tuple[str, tuple, torch.dtype]]:
    shapes = []
    with torch.no_grad():
        for name in names:
            try:
                h = model.get_submodule(name)(h)
            except Exception as e:  # the units as named do not chain: say where, before any process starts
                if _meta_cannot(e, h):
                    raise _MetaCannot from None
                hint = ""
                if name == names[0] and not h.is_floating_point() and not cfg.batch_fn and cfg.data == "tokens":
                    hint = " (model.data=tokens hands on token ids; model.data=regression, or model.batch_fn, floats)"
                last = "the last " if name == names[-1] and len(names) > 1 else ""
                raise UserError(
                    f"model.kind=module: {last}unit {name} fails on its input (shape {tuple(h.shape)}, {h.dtype}): "
                    f"{said_where(e)}{hint}"
                ) from None
            if name == names[-1]:
                break
            if not isinstance(h, torch.Tensor):
                raise UserError(f"model.kind=module: unit {name} returns {type(h).__name__}; ppx sends one tensor")
            shapes.append((name, tuple(h.shape), h.dtype))
        if cfg.loss_fn:
            _loss_is_one_number(cfg, h, target)
        else:
            _fits_the_loss(cfg, names[-1], h, target)
    return shapes


def _loss_is_one_number(cfg, out, target) -> None:
    """``model.loss_fn`` runs on the last unit's output and gives one number (a scalar tensor:
    the backward starts from it; the run's first backward failed on a loss per sample: "grad
    can be implicitly created only for scalar outputs")."""
    from ppx.models import module_spec

    fn = module_spec.load_function(cfg.loss_fn, "model.loss_fn")
    on = getattr(out, "device", None)
    try:
        loss = fn(out, target.to(on) if isinstance(target, torch.Tensor) and on is not None else target)
    except UserError:
        raise
    except Exception as e:
        if _meta_cannot(e, out):
            raise _MetaCannot from None
        raise UserError(
            f"model.loss_fn={cfg.loss_fn} fails on the last unit's output ({_said(out)}) and the targets "
            f"({_said(target)}): {said_where(e)}"
        ) from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        what = f"shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise UserError(
            f"model.loss_fn={cfg.loss_fn} returns {what} for a microbatch; ppx needs one number, a scalar tensor "
            "(the mean over the microbatch)"
        )


def _said(t) -> str:
    return f"shape {tuple(t.shape)}, {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__


def _fits_the_loss(cfg, name: str, out, target: torch.Tensor) -> None:
    """The last unit's output fits ppx's loss for ``model.data`` (one tensor; regression: the
    targets' shape; tokens: a score per vocabulary entry for each target token)."""
    loss = "MSE against the targets" if cfg.data == "regression" else "next-token cross-entropy"
    if not isinstance(out, torch.Tensor):
        raise UserError(
            f"model.kind=module: the last unit {name} returns {type(out).__name__}; ppx's loss ({loss}, model.data="
            f"{cfg.data}) takes one tensor: return it alone, or give model.loss_fn"
        )
    t = tuple(target.shape)
    if cfg.data == "regression":
        fits, want = tuple(out.shape) == t, f"{t}, the targets'"
    else:  # (the loss flattens both: a score per class, the last dimension, for each target)
        fits = out.dim() >= 2 and out.numel() == target.numel() * out.shape[-1]
        want = f"{(*t, 'classes')}, a score per class for each target"
        if target.numel() and not target.is_floating_point():  # (this batch's labels: each a class)
            fits = fits and int(target.max()) < out.shape[-1]
            want += f", more classes than the first microbatch's largest label ({int(target.max())})"
        if not cfg.batch_fn:  # ppx's token walks: every entry of the vocabulary is a class
            fits = fits and out.shape[-1] >= cfg.vocab_size
            want = f"{(*t, cfg.vocab_size)}, a score per vocabulary entry (model.vocab_size) for each target token"
    if not fits:
        raise UserError(
            f"model.kind=module: the last unit {name} returns shape {tuple(out.shape)} where ppx's loss ({loss}, "
            f"model.data={cfg.data}) wants {want}; change the model, or give model.data or model.loss_fn"
        )
