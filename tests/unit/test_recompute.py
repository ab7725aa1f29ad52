"""train.recompute and train.dtype in one process (a one-stage pipeline, no process group):
saved bytes per microbatch as the memory counters see them, the theory's costs, the rules."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ppx import config, models
from ppx.config import resolve_schedule
from ppx.engine.comm import P2P
from ppx.engine.rank import build_rank
from ppx.engine.recompute import SAVE_OPS
from ppx.errors import UserError
from ppx.measure.memory import MemoryTracker
from ppx.measure.theory import known_cost_timeline
from ppx.models.costs import recompute_modes

TRANSFORMER = [
    "model.kind=transformer",
    "model.hidden=64",
    "model.layers=2",
    "model.heads=2",
    "model.seq_len=32",
    "model.vocab_size=128",
    "pipeline.schedule=gpipe",
    "pipeline.stages=1",
    "pipeline.microbatches=2",
    "train.batch_size=8",
]


def saved_bytes_per_microbatch(recompute: str, dtype: str = "fp32") -> int:
    cfg = config.load(None, TRANSFORMER + [f"train.recompute={recompute}", f"train.dtype={dtype}"])
    pipe = build_rank(cfg, resolve_schedule(cfg), 0, "cpu", P2P())
    tracker = MemoryTracker(pipe.modules, True, pipe.in_flight, torch.device("cpu"))
    pipe.observers.append(tracker)
    tracker.begin_step(0)
    pipe.step(0)
    record = tracker.end_step(0)
    assert record["peak_inflight_microbatches"] == 2  # GPipe: both microbatches' forwards before a backward
    return record["peak_activation_bytes"] // 2


class _SavedOpBytes(TorchDispatchMode):
    """Bytes of the outputs of the ops selective recomputation keeps."""

    def __init__(self):
        super().__init__()
        self.nbytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in SAVE_OPS:
            outs = out if isinstance(out, (tuple, list)) else [out]
            self.nbytes += sum(t.untyped_storage().nbytes() for t in outs if isinstance(t, torch.Tensor))
        return out


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_saved_bytes_full_lt_selective_lt_none(dtype):
    none, selective, full = (saved_bytes_per_microbatch(rc, dtype) for rc in ("none", "selective", "full"))
    print(f"{dtype} saved bytes per microbatch: none {none}, selective {selective}, full {full}")
    assert full < selective < none
    cfg = config.load(None, TRANSFORMER)
    kind = models.kind("transformer")
    x, y = kind.make_batch(cfg.model, cfg.train.seed, 4, 0)
    # full keeps the stage's input (token ids) and, on the last stage, the target: nothing else
    assert full == x.numel() * x.element_size() + y.numel() * y.element_size()
    # selective keeps those and the outputs of the matmuls and attention, nothing else
    model = kind.build_stage(cfg.model, cfg.train.seed, 0, 1, range(2))
    counter = _SavedOpBytes()
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=dtype == "bf16"), counter:
        model(x)
    assert selective == full + counter.nbytes


def synthetic(schedule: str, recompute: str, extra=()) -> config.Config:
    return config.load(
        None,
        [
            "model.kind=synthetic",
            "model.fwd_ms=10",
            "model.bwd_ms=20",
            "model.wgrad_ms=5",
            f"pipeline.schedule={schedule}",
            "pipeline.stages=2",
            "pipeline.microbatches=4",
            f"train.recompute={recompute}",
            *extra,
        ],
    )


def test_theory_adds_the_forward_to_b_or_i_under_full():
    p, m = 2, 4
    for recompute, slot in (("none", 10 + 20 + 5), ("selective", 10 + 20 + 5), ("full", 10 + 10 + 20 + 5)):
        cfg = synthetic("1f1b", recompute)
        t = known_cost_timeline(cfg, resolve_schedule(cfg), ("nccl", 0))
        assert t.makespan == pytest.approx((m + p - 1) * slot / 1e3), recompute  # 1F1B: (m+p-1)(F+B)
    costs = {}
    for recompute in ("none", "full", "[full,none]"):
        cfg = synthetic("zb_h1", recompute)
        t = known_cost_timeline(cfg, resolve_schedule(cfg), ("nccl", 0))
        costs[recompute] = {(r, str(e.action)): e.end - e.start for r, row in enumerate(t.events) for e in row}
    assert costs["none"][(0, "0I0")] == pytest.approx(0.020)
    assert costs["full"][(0, "0I0")] == pytest.approx(0.030)  # I re-runs the forward; W does not
    assert costs["full"][(0, "0W0")] == pytest.approx(0.005)
    assert costs["[full,none]"][(1, "1I0")] == pytest.approx(0.020)


@pytest.mark.parametrize(
    "extra,message",
    [
        (["train.recompute=[full,none,none]"], "train.recompute has 3 values for 2 stages"),
        (
            ["pipeline.executor=torch", "pipeline.schedule=forward_only"],
            "pipeline.executor=torch runs training schedules: pipeline.schedule=forward_only holds no backward",
        ),
        (["train.recompute=some"], "train.recompute must be one of none | full | selective"),
        (["train.dtype=bf16", "pipeline.executor=torch"], "train.dtype=bf16 runs in ppx's runtime only"),
        (["train.recompute=full", "pipeline.schedule=torch_1f1b"], "train.recompute runs in ppx's runtime only"),
    ],
)
def test_rules(extra, message):
    with pytest.raises(UserError, match=message.replace("|", r"\|")):
        config.load(None, ["pipeline.stages=2", *extra])


def test_a_one_item_recompute_list_is_one_mode_for_every_stage():
    cfg = config.load(None, ["pipeline.stages=3", "model.layers=3", "train.recompute=[full]"])
    assert cfg.train.recompute == "full"  # as summary.json and the runs' table say it
    assert recompute_modes(cfg.train.recompute, 3) == ["full"] * 3
    assert recompute_modes(["full"], 3) == ["full"] * 3  # (a run.paired entry's config, made without load)


def test_memory_counters_see_a_checkpointed_region_by_its_inputs():
    """Nested saved-tensor hooks: inside a torch.utils.checkpoint region (non-reentrant) the
    checkpoint's own hooks take the saved tensors, so the memory counters, whose hooks are the
    outer ones, count the region by the inputs it keeps, as ppx's own recomputation is counted."""
    from torch.utils.checkpoint import checkpoint

    from ppx.schedules.comms.program import Item
    from ppx.schedules.ir.action import Action, Op

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    x = torch.randn(8, 64, requires_grad=True)
    item = Item("compute", (Action(0, Op.F, 0),), "0F0")
    seen = {}
    for name, run in {"plain": net, "checkpoint": lambda t: checkpoint(net, t, use_reentrant=False)}.items():
        tracker = MemoryTracker({0: net}, True, lambda: 1, torch.device("cpu"))
        tracker.before(item)
        run(x)
        tracker.after(item)
        seen[name] = tracker.live_bytes
    assert seen["checkpoint"] == x.numel() * 4  # the region's input, nothing from inside it
    assert seen["plain"] == (64 + 256 + 256) * 8 * 4  # input, first linear's output, GELU's output


def test_an_attention_with_dropout_is_recomputed_not_kept():
    """Its kernel draws from the generator: kept, a recomputed unit's later dropouts would draw
    other masks than its forward (on a GPU, the generator's offset would not advance)."""
    from ppx.engine.recompute import saves

    q = torch.zeros(1, 1, 2, 2)
    aten = torch.ops.aten
    cases = {  # op: (args with dropout_p = 0.1, where dropout_p sits)
        aten._scaled_dot_product_flash_attention.default: 3,
        aten._scaled_dot_product_flash_attention_for_cpu.default: 3,
        aten._scaled_dot_product_efficient_attention.default: 5,
        aten._scaled_dot_product_cudnn_attention.default: 5,
        aten._scaled_dot_product_attention_math.default: 4,
    }
    for op, at in cases.items():
        args = [q, q, q] + [None] * (at - 3)
        assert saves(op, tuple(args + [0.0]), {}) and saves(op, tuple(args), {}), op  # no dropout: kept
        assert not saves(op, tuple(args + [0.1]), {}) and not saves(op, (q, q, q), {"dropout_p": 0.1}), op
    assert saves(aten.mm.default, (q, q), {}) and not saves(aten.add.Tensor, (q, q), {})


def test_an_in_place_op_on_an_output_selective_keeps_is_named_at_the_forward():
    """An in-place ReLU after a Linear changes the matmul output selective keeps: said at the
    forward, with the way out (it failed at the backward in torch's words, "Tensor cached during
    selective activation checkpoint has been mutated"); out of place, it recomputes."""
    from torch import nn

    from ppx.engine.recompute import Recompute

    for inplace in (True, False):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=inplace), nn.Linear(8, 8))
        x = torch.randn(4, 8, requires_grad=True)
        r = Recompute("selective")
        if inplace:
            with pytest.raises(RuntimeError, match=r"^train.recompute=selective: relu_ changes in place an output"):
                r.forward(0, lambda m=m, x=x: m(x), [x])
            continue
        r.forward(0, lambda m=m, x=x: m(x), [x])
        r.recompute(0).sum().backward()
        want = torch.autograd.grad(m(x).sum(), m[0].weight)[0]
        assert torch.equal(m[0].weight.grad, want)


@pytest.mark.parametrize("unit", ["_Warming", "_Toggle"])
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_a_recomputed_forward_finds_the_buffers_its_forward_found(mode, unit):
    """Four forwards and their recomputations in 1F1B's order, of a unit whose running mean is registered at its
    first call and moved from its third on (a buffer the first forward left alone was copied for
    none, and moved twice; recomputations ran on the later microbatches' values), or whose sign
    flips in place at each forward (the second microbatch's left it as the first found it, and
    the first's recomputation flipped the live one again): the gradients and buffers of one
    process running the microbatches in turn."""
    import copy

    from helpers import own_stateful
    from ppx.engine.recompute import Recompute

    torch.manual_seed(0)
    one = torch.nn.Sequential(getattr(own_stateful, unit)(8))
    staged = copy.deepcopy(one)
    xs = [torch.randn(4, 8) for _ in range(4)]
    for x in xs:
        one(x).sum().backward()
    r = Recompute(mode, module=staged)
    for op, k in [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]:  # 1F1B's order
        if op == "F":
            r.forward(k, lambda x=xs[k]: staged(x), [xs[k]])
        else:
            r.recompute(k).sum().backward()
    assert torch.equal(staged[0].fc.weight.grad, one[0].fc.weight.grad)
    assert torch.equal(staged[0].fc.bias.grad, one[0].fc.bias.grad)
    mine, theirs = dict(staged.named_buffers()), dict(one.named_buffers())
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[n], theirs[n]) for n in mine)
