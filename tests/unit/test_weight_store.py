"""The split backward that stores (`ppx.engine.weight_store`, `ppx.engine.linears`): W's
formulas are autograd's to the bit, a storing stage's gradients equal the graph's way and a
plain backward bit for bit on every model kind, every parameter gets its gradient exactly
once, and the per-stage choice, the weight copies and the held bytes are what they say."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ppx import config, models
from ppx.engine.linears import Conv1DKind, LinearKind, StepWeights, kind_of, route_layers
from ppx.engine.precision import Precision
from ppx.engine.rank import build_runners, build_stage_modules, sample_microbatch
from ppx.engine.recompute import Recompute
from ppx.engine.split_setup import set_up_split
from ppx.engine.weight_store import WeightStore


class Conv1D(nn.Module):
    """Hugging Face GPT-2's Conv1D as transformers writes it: weight (nx, nf), x W + b by addmm."""

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


LAYOUTS = list(itertools.product([(7, 16), (4, 8, 16), (2, 3, 5, 16)], [True, False], [True, False]))


def _layout(shape, contiguous, dtype):
    x = torch.randn(*shape, dtype=dtype)
    if not contiguous:  # the same values, laid out transposed in memory
        x = x.transpose(0, -2).contiguous().transpose(0, -2) if len(shape) > 2 else x.t().contiguous().t()
    return x.requires_grad_(True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,bias,contiguous", LAYOUTS)
def test_w_formulas_are_autograds_to_the_bit(shape, bias, contiguous, dtype):
    torch.manual_seed(0)
    x = _layout(shape, contiguous, dtype)
    w = torch.randn(32, 16, dtype=dtype, requires_grad=True)
    b = torch.randn(32, dtype=dtype, requires_grad=True) if bias else None
    y = F.linear(x, w, b)
    gy = torch.randn_like(y)
    ref = torch.autograd.grad(y, [x, w] + ([b] if bias else []), gy)
    gy2, x2 = gy.reshape(-1, 32), x.detach().reshape(-1, 16)
    got = [LinearKind.weight_grad(gy2, x2)] + ([gy2.sum(0)] if bias else [])
    for r, g in zip(ref[1:], got):  # the input gradient is autograd's own (the weights enter detached)
        assert torch.equal(r, g)


@pytest.mark.parametrize("shape", sorted({s for s, _, _ in LAYOUTS}))
def test_conv1d_formulas_are_autograds_to_the_bit(shape):
    """(Contiguous inputs only: Conv1D views its input, so transformers' own forward refuses a
    non-contiguous one.)"""
    torch.manual_seed(0)
    layer = Conv1D(32, 16)
    assert kind_of(layer) is Conv1DKind and kind_of(nn.Linear(2, 3)) is LinearKind and kind_of(nn.GELU()) is None
    x = _layout(shape, True, torch.float32)
    y = layer(x)
    assert torch.equal(Conv1DKind.forward(x, layer.weight, layer.bias), y)
    gy = torch.randn_like(y)
    ref = torch.autograd.grad(y, [x, layer.weight, layer.bias], gy)
    gy2, x2 = gy.reshape(-1, 32), x.detach().reshape(-1, 16)
    got = [Conv1DKind.weight_grad(gy2, x2), gy2.sum(0)]
    for r, g in zip(ref[1:], got):
        assert torch.equal(r, g)


MODELS = {
    "mlp": ["model.kind=mlp", "model.hidden=32", "model.layers=4"],
    "transformer": ["model.kind=transformer", "model.hidden=32", "model.layers=4", "model.heads=2"]
    + ["model.seq_len=8", "model.vocab_size=64"],
    "llama": ["model.kind=llama", "model.hidden=32", "model.layers=4", "model.heads=4", "model.kv_heads=2"]
    + ["model.seq_len=8", "model.vocab_size=64"],
}
M = 4  # microbatches


def _stage(model: str, way: str, stage: int, dtype: str = "fp32", recompute: bool = False):
    """Stage ``stage`` of 3 (llama: of its 6 units split 2,2,2) run by a StageRunner with a split
    backward the ``way`` given ("store" or "graph"; "plain": no split, B)."""
    cfg = config.load(
        None,
        MODELS[model]
        + ["pipeline.stages=3", "pipeline.schedule=zb_h1", "train.batch_size=8", f"train.dtype={dtype}"]
        + [f"train.split_backward={way if way != 'plain' else 'graph'}", "train.seed=5"],
    )
    kind = models.kind(cfg.model.kind)
    modules = build_stage_modules(cfg, 3, [stage], "cpu")
    precision = Precision(dtype, "cpu")
    split = {stage} if way != "plain" else set()
    recompute = {stage: Recompute("full")} if recompute else None
    (runner,) = build_runners(cfg, modules, 3, M, precision, split, recompute=recompute).values()
    sample = sample_microbatch(cfg, precision, M, "cpu")
    info = set_up_split(cfg, runner, way != "plain", sample)
    return cfg, kind, runner, info


def _run(model: str, way: str, stage: int, dtype: str = "fp32", recompute: bool = False):
    """One step of M microbatches through one stage (F all, then I/W or B in order, as ZB-H1's
    cooldown does), two steps so the second starts from accumulated state: (input gradients,
    parameter gradients, losses)."""
    cfg, kind, runner, info = _stage(model, way, stage, dtype, recompute)
    x_all, y_all = kind.make_batch(cfg.model, 5, 2 * M, 0)
    shape, bdtype = kind.boundary(cfg.model, 2)
    gen = torch.Generator().manual_seed(1)
    xs = list(x_all.chunk(M)) if stage == 0 else [torch.randn(shape, generator=gen) for _ in range(M)]
    grads_out = [None if stage == 2 else torch.randn(shape, generator=gen) for _ in range(M)]
    cast = runner.precision.dtype if runner.precision is not None else None
    if cast is not None:
        xs = [x if stage == 0 else x.to(cast) for x in xs]
        grads_out = [g if g is None else g.to(cast) for g in grads_out]
    in_grads, outs = [], []
    runner.new_step()
    for mb in range(M):
        outs.append(runner.forward(mb, xs[mb], y_all.chunk(M)[mb] if stage == 2 else None))
    for mb in range(M):
        if way == "plain":
            in_grads.append(runner.backward(mb, grads_out[mb]))
        else:
            in_grads.append(runner.backward_input(mb, grads_out[mb]))
            if mb >= 1:
                runner.backward_weight(mb - 1)
    if way != "plain":
        runner.backward_weight(M - 1)
    assert runner.in_flight() == 0
    params = [p.grad.clone() for p in runner.module.parameters()]
    return in_grads, params, outs, info


WAYS_TO_CHECK = [(mo, s) for mo in MODELS for s in (0, 1, 2)]


@pytest.mark.parametrize("model,stage", WAYS_TO_CHECK)
def test_stored_gradients_equal_the_graphs_and_a_plain_backward_bit_for_bit(model, stage):
    ref_in, ref_params, ref_out, _ = _run(model, "plain", stage)
    for way in ("graph", "store"):
        got_in, got_params, got_out, info = _run(model, way, stage)
        assert info["mode"] == way, info
        for a, b in zip(ref_out, got_out):
            assert torch.equal(a, b)
        for a, b in zip(ref_in, got_in):
            assert (a is None and b is None) or torch.equal(a, b)
        assert len(got_params) == len(ref_params)
        for k, (a, b) in enumerate(zip(ref_params, got_params)):
            assert torch.equal(a, b), f"{way}: parameter {k}"


@pytest.mark.parametrize("model", ["transformer", "llama"])
def test_stored_gradients_equal_the_graphs_in_bf16_and_under_recompute(model):
    for dtype, recompute in (("bf16", False), ("fp32", True)):
        _, graph, _, _ = _run(model, "graph", 1, dtype, recompute)
        _, store, _, info = _run(model, "store", 1, dtype, recompute)
        assert info["mode"] == "store"
        for a, b in zip(graph, store):
            assert a.dtype == torch.float32 and torch.equal(a, b)  # fp32 masters, the same bits


@pytest.mark.parametrize("model", ["transformer", "llama"])
@pytest.mark.parametrize("dtype,recompute", [("fp32", False), ("bf16", False), ("fp32", True)])
def test_a_storing_stage_runs_the_microbatches_given_a_b_whole(model, dtype, recompute):
    """A list that gives some microbatches of a split stage a B (`whole_mbs`): their forward
    stores nothing and their B is one plain backward, the others store for their I and W; the
    gradients are a plain backward's to the bit."""
    _, ref, _, _ = _run(model, "plain", 1, dtype, recompute)
    cfg, kind, runner, info = _stage(model, "store", 1, dtype, recompute)
    assert info["mode"] == "store"
    runner.whole_mbs = frozenset({0, 1})
    shape, _ = kind.boundary(cfg.model, 2)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(shape, generator=gen) for _ in range(M)]
    grads_out = [torch.randn(shape, generator=gen) for _ in range(M)]
    if (cast := getattr(runner.precision, "dtype", None)) is not None:
        xs, grads_out = [x.to(cast) for x in xs], [g.to(cast) for g in grads_out]
    runner.new_step()
    for mb in range(M):
        runner.forward(mb, xs[mb], None)
    assert runner.store.microbatches() == ({2, 3} if not recompute else set())  # recompute stores in I
    for mb in range(M):  # B's for 0 and 1, I's for 2 and 3
        (runner.backward if mb < 2 else runner.backward_input)(mb, grads_out[mb])
    assert runner.store.microbatches() == {2, 3}
    runner.backward_weight(2)
    runner.backward_weight(3)
    assert runner.in_flight() == 0
    got = [p.grad for p in runner.module.parameters()]
    assert len(got) == len(ref) and all(torch.equal(a, b) for a, b in zip(ref, got))


def test_every_parameter_gets_its_gradient_in_exactly_one_pass():
    """I takes the small weights, W the stored layers': a partition of the trainable ones."""
    _, _, runner, info = _stage("llama", "store", 0)
    store = runner.store
    small, stored = {id(p) for p in store.small_params()}, {id(p) for p in store.stored_params()}
    every = {id(p) for p in runner.module.parameters() if p.requires_grad}
    assert small and stored and not small & stored and small | stored == every
    assert info["stored_layers"] == len(store.layers) and info["small_params"] == len(small)
    # stage 0 of llama: the embedding and two blocks' norms in I, every Linear in W
    assert all(isinstance(layer.module, nn.Linear) for layer in store.layers)


def test_a_weight_shared_with_another_layer_takes_its_gradient_in_input():
    """A tied weight (a head sharing the embedding's) is not stored: W alone would miss the
    embedding's share, and I would add it separately from autograd's order."""
    emb = nn.Embedding(16, 8)
    head = nn.Linear(8, 16, bias=False)
    head.weight = emb.weight
    mod = nn.Sequential(emb, nn.Linear(8, 8), head)
    weights = StepWeights(None)
    store = WeightStore(mod, route_layers(mod, weights))
    assert [layer.name for layer in store.layers] == ["1"]
    assert id(emb.weight) in {id(p) for p in store.small_params()}


@pytest.mark.parametrize("model,expected", [("llama", "store"), ("transformer", "store")])
def test_auto_stores_where_the_stores_hold_less_and_reports_the_bytes(model, expected):
    _, _, runner, info = _stage(model, "auto", 1)
    assert info["mode"] == expected
    assert 0 < info["store_bytes"] <= info["graph_bytes"]
    assert (runner.store is not None) == (expected == "store")


def test_auto_keeps_the_graph_where_the_stores_would_hold_more(monkeypatch):
    """Linear -> ReLU -> Linear stores each Linear's input and output gradient: more than the
    graph keeps when the inner width is large (the graph keeps one activation of it, ReLU's
    output, which the second Linear saves too, and the output gradient its W takes again)."""
    import ppx.models.mlp as mlp

    def wide(cfg, seed, stage, num_stages, blocks, clock=None):
        torch.manual_seed(seed + stage)
        return nn.Sequential(nn.Linear(cfg.hidden, 8 * cfg.hidden), nn.ReLU(), nn.Linear(8 * cfg.hidden, cfg.hidden))

    monkeypatch.setattr(mlp, "build_stage", wide)
    _, _, runner, info = _stage("mlp", "auto", 1)
    assert info["mode"] == "graph" and info["store_bytes"] > info["graph_bytes"], info
    assert runner.store is None
    assert "forward" not in runner.module[0].__dict__  # fp32 and the graph's way: nothing of ppx's left on it


def test_bf16_weight_copies_are_one_per_step_and_shared_by_microbatches():
    _, _, runner, _ = _stage("llama", "store", 1, "bf16")
    runner.new_step()
    kind = models.kind("llama")
    shape, _ = kind.boundary(config.load(None, MODELS["llama"]).model, 2)
    for mb in range(2):
        runner.forward(mb, torch.randn(shape).to(torch.bfloat16), None)
    copies = runner.weights.copies
    assert copies and all(w.dtype == torch.bfloat16 for w, _ in copies.values())
    first = {k: w.data_ptr() for k, (w, _) in copies.items()}
    runner.forward(2, torch.randn(shape).to(torch.bfloat16), None)
    assert first == {k: w.data_ptr() for k, (w, _) in copies.items()}, "one copy for every microbatch of a step"
    runner.new_step()
    runner.forward(3, torch.randn(shape).to(torch.bfloat16), None)
    assert all(first[k] != w.data_ptr() for k, (w, _) in copies.items()), "new copies in the next step"
    assert runner.weights.storages == {w.untyped_storage().data_ptr() for w, _ in copies.values()}


class _Twice(nn.Module):
    """One Linear called twice in a forward (its two contributions summed as autograd sums them)."""

    def __init__(self, hidden):
        super().__init__()
        self.inner = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x):
        return self.inner(torch.tanh(self.inner(self.norm(x))))


def test_a_layer_called_twice_stores_both_calls_and_sums_them_as_autograd(monkeypatch):
    import ppx.models.mlp as mlp

    monkeypatch.setattr(mlp, "build_stage", lambda cfg, seed, stage, n, blocks, clock=None: _Twice(cfg.hidden))
    torch.manual_seed(0)
    _, plain, _, _ = _run("mlp", "plain", 1)
    torch.manual_seed(0)
    _, store, _, info = _run("mlp", "store", 1)
    assert info["mode"] == "store" and info["stored_layers"] == 1
    for a, b in zip(plain, store):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "shape,contiguous",
    [((7, 16), True), ((7, 16), False), ((4, 8, 16), True), ((4, 8, 16), False)]
    + [((2, 3, 5, 16), True), ((2, 3, 5, 16), False), ((16,), True)],
)
def test_a_stored_linear_is_autograds_to_the_bit_on_every_layout(shape, contiguous, bias):
    """A routed Linear's storing forward, I and W against a plain forward and backward on each
    input layout: the same output and input, weight and bias gradients bit for bit (an input of
    more than two dimensions that is not contiguous is folded to 2-D as autograd's own forward
    folds it, not multiplied batched as ``matmul`` multiplies it with a detached weight)."""
    torch.manual_seed(0)
    plain = nn.Linear(16, 32, bias=bias)
    routed = copy.deepcopy(plain)
    store = WeightStore(routed, route_layers(routed, StepWeights(None)))
    x = _layout(shape, contiguous, torch.float32)
    gy = torch.randn(*shape[:-1], 32)
    y_ref = plain(x)
    ref = torch.autograd.grad(y_ref, [x, *plain.parameters()], gy)
    xs = x.detach().requires_grad_(True)
    store.begin(0)
    y = routed(xs)
    assert torch.equal(y, y_ref)
    gx = store.input_pass(0, y, xs, gy)
    ((_, _, kept),) = store.pending[0]
    assert torch.equal(kept, gy)
    store.weight_pass(0)
    for r, got in zip(ref, [gx, *(p.grad for p in routed.parameters())], strict=True):
        assert torch.equal(r, got)


def test_a_layer_whose_input_needs_no_gradient_keeps_the_graphs_way(monkeypatch):
    """A Linear fed by a constant (no gradient flows into its input): auto keeps the graph's way
    and says why; store is refused in one line before any step."""
    import ppx.models.mlp as mlp

    class FromConstant(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.gate = nn.Linear(hidden, hidden)
            self.register_buffer("bias_in", torch.ones(hidden))

        def forward(self, x):
            return x * torch.sigmoid(self.gate(self.bias_in))

    monkeypatch.setattr(mlp, "build_stage", lambda cfg, seed, stage, n, blocks, clock=None: FromConstant(cfg.hidden))
    _, _, runner, info = _stage("mlp", "auto", 1)
    assert info["mode"] == "graph" and "needs no gradient" in info["why"] and runner.store is None
    from ppx.errors import UserError

    with pytest.raises(UserError, match="train.split_backward=store: layer gate: its input needs no gradient"):
        _stage("mlp", "store", 1)


@pytest.mark.parametrize("model,stage", [("llama", 1), ("llama", 2), ("transformer", 2), ("mlp", 2)])
def test_the_trial_forwards_leave_nothing_alive(model, stage):
    """auto weighs the stores against the graph with two trial forwards when the rank is
    built; neither may outlive the choice (a graph that saved its own output, as attention
    and log-softmax do, once held itself and so a whole forward's activations for the run)."""
    import gc
    import weakref

    outputs = []

    def note(module, args, out):
        if isinstance(out, torch.Tensor):
            outputs.append(weakref.ref(out))

    handle = nn.modules.module.register_module_forward_hook(note)
    try:
        _, _, runner, info = _stage(model, "auto", stage)
    finally:
        handle.remove()
    assert info["mode"] == "store" and len(outputs) > 4, info
    gc.collect()
    alive = [r() for r in outputs if r() is not None]
    assert not alive, f"{len(alive)} of the trials' {len(outputs)} module outputs still alive"


def test_auto_weighs_the_graph_without_the_steps_weight_copies():
    """In bf16 auto's graph_bytes counted the stage's bf16 copy of each Linear weight, which the
    trial's own forward cast after the copies to leave out were read (llama-tiny's stage 1 at
    p=2: 995328 bytes against 765952 that its forward saves). They are the bytes a forward the
    graph's way saves, beside the step's copies (`StepWeights.refresh`) and the parameters, and
    the output gradient (a boundary activation's bytes, in bf16) its W takes again."""
    from torch.autograd.graph import saved_tensors_hooks

    cfg, kind, _, info = _stage("llama", "auto", 1, "bf16")
    _, _, graph, _ = _stage("llama", "graph", 1, "bf16")
    graph.new_step()  # (its forward casts the step's copies)
    params = {p.untyped_storage().data_ptr() for p in graph.module.parameters()}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params | graph.weights.storages:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    shape, _ = kind.boundary(cfg.model, cfg.train.batch_size // M)
    with saved_tensors_hooks(pack, lambda t: t):
        graph.forward(0, torch.randn(shape).to(torch.bfloat16), None)
    gradient = math.prod(shape) * 2
    assert graph.weights.storages and info["graph_bytes"] == sum(saved.values()) + gradient > gradient, (info, gradient)
