"""The one config schema: dataclasses whose fields document themselves through ``help``
metadata (`describe` lists them all; docs/config.md is generated from it). Loading is in
`ppx.config.loading`, the cross-field rules in `ppx.config.rules`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Dict, List, Literal, Optional

from ppx.models import kinds_help
from ppx.schedules.registry import names_help, virtual_help

# model.layers' ceiling: above the deepest published transformers' (DeepNet's 1000 layers; Llama 3 405B
# has 126 blocks). Every layer is a module of its own and an entry in the split's lists, and a split by
# FLOPs is quadratic in them (1024 take 1 s on 8 stages); 10^9 had ppx split allocate lists until the OOM
# killer ended it
MAX_LAYERS = 1024


def _f(default: Any, help: str, **kw):
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help}, **kw)
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class PipelineConfig:
    schedule: str = _f(
        "1f1b",
        f"{names_help()} (torch_*: torch.distributed.pipelining's own), or the path of a torch-style schedule CSV",
    )
    stages: int = _f(
        2, "pipeline ranks (the job's processes: ranks x parallel.data); each holds pipeline.virtual_stages stages"
    )
    microbatches: int = _f(4, "microbatches per step; train.batch_size must divide evenly")
    virtual_stages: Optional[int] = _f(
        None,
        virtual_help(),
    )
    layers_per_stage: Optional[List[int]] = _f(
        None,
        "explicit uneven split, e.g. [3,1]: layers per stage (one entry per stage, all ranks' virtual stages "
        "included), summing to model.layers; llama counts its embedding and head as units too (units = "
        "[embedding, blocks, head]: the sum is model.layers + 2); default: pipeline.balance's split",
    )
    balance: Literal["flops", "units"] = _f(
        "flops",
        "the default split (no pipeline.layers_per_stage): flops (contiguous units whose heaviest stage does as "
        "few forward FLOPs as any split's; among those, the stages most alike, then the split nearest the even "
        "one: llama's embedding weighs nothing and its head a third of a llama-tiny block, 4 of a llama-1b "
        "block, so a V schedule's first and last stages take a block more; FLOPs by formula, "
        "ppx/models/llama_shapes.py; hf's and module's counted on the model built on the meta device, "
        "ppx/models/hf_flops.py, module_flops.py) | units (every stage the same number of units, the first ones "
        "one more: the embedding and head count as blocks); every other kind splits evenly either way",
    )
    executor: Literal["ppx", "torch"] = _f(
        "ppx",
        "which runtime executes the schedule's action list: ppx's | torch (the list, comms included, exported to "
        "torch's CSV form and run by torch.distributed.pipelining's _PipelineScheduleRuntime); torch_* schedules imply torch",
    )
    split: Literal["layers", "tracer"] = _f(
        "layers",
        "layers: each stage builds its own blocks | tracer: build the whole model as one nn.Module and cut it "
        "with torch.distributed.pipelining's tracer (pipeline() with a split point before each stage's first block; "
        "mlp, transformer, llama and module)",
    )


@dataclass
class ParallelConfig:
    data: int = _f(
        1,
        "data-parallel degree d: d replicas of the pipeline, world = pipeline.stages x d processes; train.batch_size "
        "is the global batch, each replica takes batch_size / d of it (split into pipeline.microbatches)",
    )
    data_shard: bool = _f(
        False,
        "parallel.data > 1: false = each stage's gradients are all-reduced across the replicas (torch's replicate) | "
        "true = each stage module is sharded across them with FSDP2 fully_shard (gradients reduce-scattered)",
    )


@dataclass
class ModelConfig:
    kind: str = _f("mlp", kinds_help())
    preset: Optional[str] = _f(
        None,
        "named llama shapes (random init, nothing downloaded): llama-tiny (hidden 64, 4 layers: a laptop's) | "
        "llama-1b (Llama 3.2 1B) | llama-8b (Llama 3 8B); sets model.kind=llama and model.hidden, layers, heads, "
        "kv_heads, ffn_hidden, vocab_size, seq_len, rope_theta; keys given beside it (experiment or command line) win",
    )
    hidden: int = _f(64, "hidden width (features)")
    layers: int = _f(
        4, "number of blocks split over the stages (MLP blocks or decoder blocks), at most " + str(MAX_LAYERS)
    )
    heads: int = _f(4, "transformer, llama: attention (query) heads; must divide model.hidden")
    seq_len: int = _f(32, "transformer, llama: tokens per sequence")
    vocab_size: int = _f(256, "transformer, llama: vocabulary size (tokens)")
    ffn_mult: int = _f(4, "transformer: MLP width as a multiple of model.hidden")
    kv_heads: Optional[int] = _f(
        None,
        "llama: key/value heads of grouped-query attention (each serves model.heads / model.kv_heads query "
        "heads); must divide model.heads; null: model.heads (plain multi-head attention)",
    )
    ffn_hidden: Optional[int] = _f(
        None,
        "llama: SwiGLU MLP width (features of w1 and w3); null: Llama's rule, 8/3 x model.hidden rounded up to "
        "a multiple of 256 (of 32 when model.hidden < 512)",
    )
    rope_theta: float = _f(
        10000.0,
        "llama: rotary embedding base (position t turns dimension pair i by t / rope_theta^(2i / head dim) "
        "radians); Llama 3 uses 500000",
    )
    fwd_ms: Any = _f(
        10.0,
        "synthetic: forward time per microbatch in ms of a stage (or of a layer: model.cost_per); one value or a "
        "list, one per stage (per layer)",
    )
    bwd_ms: Any = _f(
        20.0,
        "synthetic: input-gradient backward time per microbatch in ms of a stage (or of a layer: model.cost_per); "
        "one value or one per stage (per layer)",
    )
    wgrad_ms: Any = _f(
        0.0,
        "synthetic: weight-gradient time per microbatch in ms of a stage (or of a layer: model.cost_per); a full "
        "backward costs bwd_ms + wgrad_ms, split or not",
    )
    hf_config: Optional[str] = _f(
        None,
        "hf: the Hugging Face model's config: a model type transformers knows (llama, qwen2, mistral, gpt2, ...: its "
        "default config), a config.json, a folder holding one, or a hub id already in the local Hugging Face cache "
        "(nothing is downloaded); its num_hidden_layers, hidden_size, num_attention_heads and vocab_size fill "
        "model.layers, hidden, heads and vocab_size unless the experiment or command line sets them (those win)",
    )
    hf_overrides: Dict[str, Any] = _f(
        {},
        "hf: keys of the Hugging Face config set on top of it, e.g. {intermediate_size: 128, num_key_value_heads: 2, "
        "tie_word_embeddings: true, resid_pdrop: 0.0}",
    )
    module: Optional[str] = _f(
        None,
        "module: your model, 'package.module:function'; the function takes this model section (read your own keys "
        "from model.args) and returns an nn.Module whose forward calls its units (model.units) in turn",
    )
    args: Dict[str, Any] = _f({}, "module: your model function's own keys (any), as model.args")
    units: Optional[List[str]] = _f(
        None,
        "module: the submodules (dotted names) your model's forward calls in turn, the split's units: a ModuleList, "
        "ModuleDict or Sequential name stands for its children (a ModuleDict's in its order); null: the model's own "
        "children, each one unit (a Sequential among them too), if it is an nn.Sequential; model.layers is set to "
        "their number",
    )
    split_points: Optional[List[str]] = _f(
        None,
        "module: the units where stages 1, 2, ... begin (torch.distributed.pipelining's SplitPoint.BEGINNING), one "
        "per stage after the first; instead of pipeline.layers_per_stage",
    )
    data: Literal["tokens", "regression"] = _f(
        "tokens",
        "module: ppx's data and loss when model.batch_fn / model.loss_fn are not given: tokens (token walks of "
        "model.seq_len over model.vocab_size, next-token cross-entropy) | regression (x ~ N(0, 1) of model.hidden "
        "features, targets tanh(x T), MSE)",
    )
    batch_fn: Optional[str] = _f(
        None,
        "module: 'package.module:function' (model section, seed, batch_size, step) -> (inputs, targets), the same "
        "for a seed on every run; null: model.data's",
    )
    loss_fn: Optional[str] = _f(
        None, "module: 'package.module:function' (output, target) -> a scalar loss (a mean); null: model.data's"
    )
    cost_per: Literal["stage", "layer"] = _f(
        "stage",
        "synthetic: what model.fwd_ms/bwd_ms/wgrad_ms are the ms of. stage: every stage costs them whatever its "
        "layers, so v stages per rank do v times the work of one | layer: every layer costs them and a stage the "
        "sum over its layers, so a step's work is model.layers x the costs whatever the schedule, p and v (placements "
        "compared at equal work). ppx sweep across pipeline.schedule or pipeline.virtual_stages uses layer unless "
        "the experiment or the command line sets this key",
    )


@dataclass
class TrainConfig:
    batch_size: int = _f(32, "samples per step (the whole batch, split into microbatches)")
    steps: int = _f(10, "optimizer steps")
    seed: int = _f(0, "seed for weights and synthetic data: same seed, same losses")
    lr: float = _f(0.01, "learning rate")
    optimizer: Literal["sgd", "adamw"] = _f("sgd", "sgd | adamw")
    dtype: Literal["fp32", "bf16", "fp16"] = _f(
        "fp32",
        "compute dtype: fp32 | bf16 | fp16 (autocast, fp32 master weights and optimizer; fp16 adds dynamic loss "
        "scaling, a skipped step on any rank's overflow skips it on all); activations and gradients between stages "
        "travel in it; ppx's runtime only (not pipeline.executor=torch)",
    )
    recompute: Any = _f(
        "none",
        "activation recomputation: none | full (a stage keeps only its input and re-runs its forward in its B, or "
        "its I when split) | selective (keeps matmul and attention outputs, recomputes the cheap element-wise ops); "
        "one value or a list, one per stage; ppx's runtime only (not pipeline.executor=torch); under a list without "
        "backward (forward_only) it changes nothing, and ppx run says so",
    )
    split_backward: Literal["auto", "store", "graph", "drain"] = _f(
        "auto",
        "how a split backward (I, then W) gets its weight gradients: store (I stores each Linear layer's input "
        "and output gradient and drops the graph; W does only the weight matmuls; small weights such as norms "
        "and embeddings take their gradients in I) | graph (I keeps the graph and W walks it again) | auto "
        "(per stage, store where the stores hold no more bytes than the graph, measured once at build; a stage "
        "without Linear layers keeps its graph; a stage whose every I the schedule follows at once by its W, "
        "as ZB-H1's and ZB-V's first stage, runs one whole backward in the I and nothing in the W: whole) | drain "
        "(auto's way, but a stage splits only the microbatches whose W the schedule runs after its last forward, "
        "where a W can fill the drain; every other microbatch runs one whole backward, B, at its I's place: the "
        "list itself changes, as ppx schedule --drain shows); the "
        "choice per stage goes to summary.json (split_backward); "
        "store, graph and auto are ppx's runtime's (pipeline.executor=torch splits its own way; drain's list runs "
        "there too); under a schedule without I and W it changes nothing, and ppx run says so",
    )


@dataclass
class RuntimeConfig:
    device: Literal["auto", "cpu", "cuda"] = _f(
        "auto", "auto: CUDA+NCCL with one GPU per process (pipeline ranks x parallel.data), else CPU+gloo | cpu | cuda"
    )
    timeout_s: float = _f(
        60.0,
        "seconds without progress on one rank before the whole job is ended, at least 1 (set-up is allowed at "
        "least 60: building the model, waiting for the other ranks' builds, NCCL's first collective)",
    )
    threads_per_rank: int = _f(1, "CPU threads per process (torch.set_num_threads)")
    pin_cpus: bool = _f(
        True,
        "CPU runs: pin each local rank, its threads included, to its own block of the CPUs the job may use "
        "(with more ranks than CPUs, one CPU each, round robin, so pipeline neighbours never share one), so a woken "
        "communication thread cannot stall a neighbour's compute; the CPUs go to env.json",
    )
    fork_ranks: bool = _f(
        True,
        "CPU runs on Linux: torchrun forks the ranks from its own process, which imported torch and the worker's "
        "modules once (a 1-step run on a 2-core machine: 4.8 s against 9.1 s with 4 ranks, 4.0 against 5.1 with 2); "
        "false starts each rank as python -m ppx.launch.worker, as CUDA runs always do (a process that has touched "
        "CUDA cannot fork)",
    )
    early_agent: bool = _f(
        True,
        "CPU runs on Linux with 2+ cores: ppx run starts the agent's process as it starts, which imports torch "
        "(and transformers for model.kind=hf) while the config is checked, and forks torchrun's agent once the run "
        "is claimed (a 2-step hf_llama_tiny_1f1b_2cpu run 9.2 s against 13.9); false: the agent starts as a new "
        "process after the checks",
    )
    gc_steps: int = _f(
        1,
        "Python's garbage collector: automatic collection is off while the run trains and a collection runs every "
        "this many steps, between steps, outside the timed step (an automatic one pauses a rank inside a step: "
        "about 140 ms on a 4-stage-per-rank CPU run); 0 leaves automatic collection on",
    )
    recv_lookahead: int = _f(
        -1,
        "gloo: -1 posts all of a step's receives at the rank's first wait, where it idles anyway (their buffers, "
        "one boundary tensor per microbatch and direction, are then held together); k > 0 posts each "
        "receive k compute actions before the one that needs it; 0 right before it. Early receives let data land "
        "while the stage computes (gloo sends only once the receive is posted). NCCL: always 0",
    )
    cpu_fallback: List[str] = _f(
        [],
        "key=value overrides applied when runtime.device=auto falls back to CPU (not enough GPUs), after the "
        "experiment's keys and before the command line's, e.g. [model.preset=llama-tiny] so a GPU experiment still "
        "fits a laptop; one notice line names them and the run's config.yaml holds the result",
    )
    inject_fault: Optional[str] = _f(
        None,
        "testing the failure path: 'hang@<action>' or 'die@<action>', e.g. hang@1F2 (with parallel.data > 1, "
        "in replica 0)",
    )


@dataclass
class InstrumentConfig:
    timers: bool = _f(
        True, "time every action (CUDA events on GPU, perf_counter on CPU) and split each step into compute/comm/idle"
    )
    memory: bool = _f(True, "count microbatches in flight and saved activation bytes per stage (saved-tensor hooks)")
    memory_steps: int = _f(
        1,
        "with instrument.memory: the saved activation bytes are counted in this many first steps (0: every step); "
        "with fixed shapes they repeat step to step, and the hooks cost about 3 us per saved tensor (a tenth of a "
        "small model's step), so the other steps record only the peak memory and the microbatches in flight",
    )
    timeline: bool = _f(
        True,
        "write timeline.json (Chrome/Perfetto) and timeline.png (with logging.report); needs instrument.timers; "
        "the measured costs and the prediction come from its steps (false: none)",
    )
    timeline_steps: int = _f(
        5,
        "how many of the last steps go into timeline.json (the PNG shows the last one); the simulator's measured "
        "costs come from these steps",
    )


@dataclass
class ProfileConfig:
    enabled: bool = _f(
        False, "torch.profiler traces per rank in <run>/tb/, beside the scalars (off: no profiler, no cost)"
    )
    wait: int = _f(1, "profiler schedule: steps skipped before each cycle")
    warmup: int = _f(1, "profiler schedule: steps traced but discarded")
    active: int = _f(2, "profiler schedule: steps recorded per cycle")
    repeat: int = _f(1, "profiler schedule: cycles (0 = until the run ends)")
    record_shapes: bool = _f(False, "record operator input shapes")
    profile_memory: bool = _f(False, "record tensor allocations (Memory view)")
    with_stack: bool = _f(False, "record Python stacks (large traces)")


@dataclass
class WandbConfig:
    mode: Literal["offline", "online", "disabled"] = _f(
        "offline",
        "offline (default: no account, sync later with `wandb sync`; W&B starts once the steps are over, in a"
        " process of its own beside the report's drawing: about 0.3 s of a short CPU run on 2 cores, and 5 MB,"
        " report.html logged again) | online (needs `wandb login`; starts with the run, each step logged as it"
        " comes, beside the steps) | disabled",
    )
    project: str = _f("ppx", "W&B project")
    entity: Optional[str] = _f(None, "W&B entity (team or user); default: your default entity")
    group: Optional[str] = _f(None, "W&B group; default: the experiment name, so a sweep's runs sit together")
    tags: List[str] = _f([], "W&B tags")


@dataclass
class LoggingConfig:
    tensorboard: bool = _f(True, "write TensorBoard scalars to <run>/tb/")
    wandb: WandbConfig = field(default_factory=WandbConfig)
    progress_every: int = _f(1, "rank 0 prints step, loss, step time and bubble every N steps (0: never)")
    report: bool = _f(
        True,
        "draw report.html, breakdown.png and timeline.png as the run ends (about 2.4 s of CPU at a CPU run's end,"
        " 2 cores);"
        " false: the JSON files only (summary, metrics, timeline.json), and a sweep of such runs compares them"
        " in compare.md and compare.json only",
    )


@dataclass
class RunConfig:
    name: Optional[str] = _f(None, "experiment name; default: the experiment file's name")
    root: str = _f(
        "runs", "parent folder of run directories: <root>/<name>/<run id>/ (~: your home folder; not inside a run)"
    )
    dir: Optional[str] = _f(
        None,
        "exact run directory (must not exist yet, nor lie inside another run; ~: your home folder); overrides run.root",
    )
    paired: List[str] = _f(
        [],
        "other configs run step by step beside this one, in its processes, to tell two apart where whole runs "
        "cannot (a busy machine moves a run's step by 30%): each entry key=value overrides of this run's config, "
        "space-separated, of pipeline.*, model.* and train.* keys but pipeline.stages, train.steps and "
        "model.preset, e.g. ['pipeline.schedule=zb_h1', 'pipeline.schedule=zb_h1 train.split_backward=drain']; "
        "each runs on a pipeline of its own from the same seed and data, with its own optimizer, its step "
        "before the run's on odd steps and after it on even ones; summary.json's paired gives its median step "
        "over the run's beside it and whether their losses agree (parallel.data=1, ppx's runtime; beside "
        "model.kind=module, no model.* key; the timeline, prediction, report and saved-activation counts are "
        "the run's alone, while peak_memory_bytes counts the entries' weights and optimizer state too)",
    )


@dataclass
class Config:
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    instrument: InstrumentConfig = field(default_factory=InstrumentConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def microbatch_size(self, microbatches: int | None = None) -> int:
        """Samples in one microbatch of one data-parallel replica: ``train.batch_size`` over
        ``parallel.data`` replicas and ``microbatches`` (``pipeline.microbatches`` by default),
        rounded down (`rules` refuse a batch that leaves a microbatch empty)."""
        m = self.pipeline.microbatches if microbatches is None else microbatches
        return self.train.batch_size // self.parallel.data // m


def describe(cls=Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, help) for every leaf field of the schema."""
    rows = []
    for f in fields(cls):
        default = f.default_factory() if f.default_factory is not field().default_factory else f.default
        if is_dataclass(default):
            rows += describe(type(default), f"{prefix}{f.name}.")
        else:
            rows.append((f"{prefix}{f.name}", "null" if default is None else str(default), f.metadata.get("help", "")))
    return rows
