"""The models the checks run, as config keys, and how long a run is expected to take.

Estimates (docs/benchmarks.md, "On a GPU", gives the per-check table `ppx gpu-check --dry-run`
prints): a run's wall time is its start-up (Python and torch imported, CUDA context, model
built, summary written; torchrun and NCCL's set-up for several processes) plus its steps. The
start-up figures are this project's 2-core CPU machine's (3.5 s for one process, 6.5 s for two
under torchrun) with room for CUDA's and NCCL's initialisation; a step of a real model is its
training FLOPs (6 x parameters x tokens, plus attention's) at an fp32 rate well below an
H100's (67 TFLOP/s peak without TF32), spread over the ranks with a 50% allowance for the
bubble; a known-cost step is its set costs."""

from __future__ import annotations

STARTUP_S = 8.0  # one process
TORCHRUN_S = 12.0  # several processes: torchrun's rendezvous and NCCL's set-up on top
PER_RANK_S = 1.0  # each further process
FP32_FLOP_S = 20e12  # sustained fp32 FLOP/s assumed per GPU


def startup_s(processes: int) -> float:
    return STARTUP_S if processes == 1 else TORCHRUN_S + PER_RANK_S * processes


def known_cost(
    schedule: str,
    p: int,
    m: int,
    fwd_ms: float,
    bwd_ms: float,
    wgrad_ms: float = 0.0,
    steps: int = 6,
    v: int | None = None,
) -> dict:
    """The known-cost model (model.kind=synthetic): every stage's forward, input-gradient and
    weight-gradient take exactly these ms (a GPU spin on CUDA), a full backward bwd + wgrad."""
    keys = {
        "model.kind": "synthetic",
        "model.hidden": 16,
        "model.layers": max(4, p * (v or 2)),
        "model.fwd_ms": fwd_ms,
        "model.bwd_ms": bwd_ms,
        "model.wgrad_ms": wgrad_ms,
        "train.batch_size": 2 * m,
        "train.steps": steps,
        **pipeline(schedule, p, m, v),
    }
    return keys


def known_cost_seconds(keys: dict) -> float:
    """An upper bound of the run's steps: every action of every stage one after the other."""
    p, m, v = keys["pipeline.stages"], keys["pipeline.microbatches"], keys.get("pipeline.virtual_stages") or 2
    per_mb = keys["model.fwd_ms"] + keys["model.bwd_ms"] + keys["model.wgrad_ms"]
    return keys["train.steps"] * p * v * m * per_mb / 1e3


def pipeline(schedule: str, p: int, m: int, v: int | None = None) -> dict:
    keys = {"pipeline.schedule": schedule, "pipeline.stages": p, "pipeline.microbatches": m}
    if v is not None:
        keys["pipeline.virtual_stages"] = v
    return keys


def transformer(hidden: int, layers: int, heads: int, seq_len: int, vocab: int, batch: int, steps: int) -> dict:
    """The GPT-style decoder (model.kind=transformer), SGD: no optimizer state."""
    return {
        "model.kind": "transformer",
        "model.hidden": hidden,
        "model.layers": layers,
        "model.heads": heads,
        "model.seq_len": seq_len,
        "model.vocab_size": vocab,
        "train.batch_size": batch,
        "train.steps": steps,
        "train.optimizer": "sgd",
    }


def llama(
    hidden: int, layers: int, heads: int, kv_heads: int, seq_len: int, vocab: int, batch: int, steps: int
) -> dict:
    return {
        "model.kind": "llama",
        "model.hidden": hidden,
        "model.layers": layers,
        "model.heads": heads,
        "model.kv_heads": kv_heads,
        "model.seq_len": seq_len,
        "model.vocab_size": vocab,
        "train.batch_size": batch,
        "train.steps": steps,
        "train.optimizer": "sgd",
    }


def llama_tiny(seq_len: int, batch: int, steps: int) -> dict:
    """model.preset=llama-tiny (hidden 64, 4 blocks, 4 heads sharing 2 key/value heads) at
    ``seq_len`` tokens per sequence."""
    return {
        "model.kind": "llama",
        "model.preset": "llama-tiny",
        "model.seq_len": seq_len,
        "train.batch_size": batch,
        "train.steps": steps,
        "train.optimizer": "sgd",
    }


def model_seconds(keys: dict, processes: int) -> float:
    """The steps of a transformer or llama run at `FP32_FLOP_S` per GPU."""
    h, layers, seq = keys.get("model.hidden", 64), keys.get("model.layers", 4), keys["model.seq_len"]
    vocab = keys.get("model.vocab_size", 256)
    params = 12 * h * h * layers + 2 * vocab * h
    tokens = keys["train.batch_size"] * seq
    flops = 6 * params * tokens + 12 * layers * seq * h * tokens
    return keys["train.steps"] * flops / (FP32_FLOP_S * processes) * 1.5
