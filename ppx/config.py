"""The one config schema (dataclasses + OmegaConf) and its loading: defaults, then an
experiment YAML, then ``key=value`` overrides. Unknown keys and wrong types are rejected;
`check` adds the cross-field rules. Every field documents itself through ``help`` metadata
(`describe` lists them all; the README table is generated from it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, List, Literal, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ppx.errors import UserError


def _f(default: Any, help: str, **kw):
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class PipelineConfig:
    schedule: str = _f(
        "1f1b", "naive | gpipe | 1f1b | forward_only | interleaved_1f1b | zb_h1 | torch_gpipe | torch_1f1b | "
        "torch_interleaved1f1b (torch.distributed.pipelining's own), or the path of a torch-style schedule CSV"
    )
    stages: int = _f(2, "pipeline stages = processes (one stage per process)")
    microbatches: int = _f(4, "microbatches per step; train.batch_size must divide evenly")
    virtual_stages: Optional[int] = _f(
        None, "stages per rank v for interleaved schedules (stage s on rank s % stages); null: 2 for interleaved, else 1"
    )
    layers_per_stage: Optional[List[int]] = _f(None, "explicit uneven split, e.g. [3,1] (one entry per stage, all ranks' virtual stages included); default: even")
    executor: Literal["ppx", "torch"] = _f(
        "ppx", "which runtime executes the schedule's action list: ppx's | torch (the list, comms included, exported to "
        "torch's CSV form and run by torch.distributed.pipelining's _PipelineScheduleRuntime); torch_* schedules imply torch"
    )
    split: Literal["layers", "tracer"] = _f(
        "layers", "layers: each stage builds its own blocks | tracer: build the whole model as one nn.Module and cut it "
        "with torch.distributed.pipelining's tracer (pipeline() with a split point before each stage's first block; "
        "mlp and transformer)"
    )


@dataclass
class ModelConfig:
    kind: Literal["mlp", "transformer", "synthetic"] = _f(
        "mlp", "mlp (Linear+GELU blocks, MSE) | transformer (GPT-style decoder, cross-entropy) | synthetic (known per-stage costs)"
    )
    hidden: int = _f(64, "hidden width (features)")
    layers: int = _f(4, "number of blocks split over the stages (MLP blocks or decoder blocks)")
    heads: int = _f(4, "transformer: attention heads; must divide model.hidden")
    seq_len: int = _f(32, "transformer: tokens per sequence")
    vocab_size: int = _f(256, "transformer: vocabulary size")
    ffn_mult: int = _f(4, "transformer: MLP width as a multiple of model.hidden")
    fwd_ms: Any = _f(10.0, "synthetic: forward time of a stage per microbatch in ms; one value or a list, one per stage")
    bwd_ms: Any = _f(20.0, "synthetic: input-gradient backward time of a stage per microbatch in ms; one value or one per stage")
    wgrad_ms: Any = _f(0.0, "synthetic: weight-gradient time in ms (a full backward costs bwd_ms + wgrad_ms, split or not)")


@dataclass
class TrainConfig:
    batch_size: int = _f(32, "samples per step (the whole batch, split into microbatches)")
    steps: int = _f(10, "optimizer steps")
    seed: int = _f(0, "seed for weights and synthetic data: same seed, same losses")
    lr: float = _f(0.01, "learning rate")
    optimizer: Literal["sgd", "adamw"] = _f("sgd", "sgd | adamw")


@dataclass
class RuntimeConfig:
    device: Literal["auto", "cpu", "cuda"] = _f("auto", "auto: CUDA+NCCL with one GPU per stage, else CPU+gloo | cpu | cuda")
    timeout_s: float = _f(60.0, "seconds without progress on one rank before the whole job is ended")
    threads_per_rank: int = _f(1, "CPU threads per process (torch.set_num_threads)")
    pin_cpus: bool = _f(
        True, "CPU runs: pin each local rank, its threads included, to its own block of the CPUs the job may use "
        "(with more ranks than CPUs, one CPU each, round robin, so pipeline neighbours never share one), so a woken "
        "communication thread cannot stall a neighbour's compute; the CPUs go to env.json"
    )
    recv_lookahead: int = _f(
        -1, "gloo: -1 posts all of a step's receives at the rank's first wait, where it idles anyway (their buffers, "
        "one boundary tensor per microbatch and direction, are then held together); k > 0 posts each "
        "receive k compute actions before the one that needs it; 0 right before it. Early receives let data land "
        "while the stage computes (gloo sends only once the receive is posted). NCCL: always 0"
    )
    inject_fault: Optional[str] = _f(None, "testing the failure path: 'hang@<action>' or 'die@<action>', e.g. hang@1F2")


@dataclass
class InstrumentConfig:
    timers: bool = _f(True, "time every action (CUDA events on GPU, perf_counter on CPU) and split each step into compute/comm/idle")
    memory: bool = _f(True, "count microbatches in flight and saved activation bytes per stage (saved-tensor hooks)")
    timeline: bool = _f(True, "write timeline.json (Chrome/Perfetto) and timeline.png; needs instrument.timers")
    timeline_steps: int = _f(
        5, "how many of the last steps go into timeline.json (the PNG shows the last one); the simulator's measured "
        "costs come from these steps"
    )


@dataclass
class ProfileConfig:
    enabled: bool = _f(False, "torch.profiler traces per rank in <run>/traces/ (off: no profiler, no cost)")
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
        "offline", "offline (default: no account, sync later with `wandb sync`) | online (needs `wandb login`) | disabled"
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


@dataclass
class RunConfig:
    name: Optional[str] = _f(None, "experiment name; default: the experiment file's name")
    root: str = _f("runs", "parent folder of run directories: <root>/<name>/<run id>/")
    dir: Optional[str] = _f(None, "exact run directory (must not exist yet); overrides run.root")


@dataclass
class Config:
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    instrument: InstrumentConfig = field(default_factory=InstrumentConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    run: RunConfig = field(default_factory=RunConfig)


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


def experiments_dirs() -> list[Path]:
    """Where experiment names are looked up: ./experiments, then the repo's experiments/."""
    here = Path(__file__).resolve().parent.parent / "experiments"
    dirs = [Path.cwd() / "experiments"]
    if here not in dirs:
        dirs.append(here)
    return dirs


def find_experiment(exp: str) -> Path:
    p = Path(exp)
    if p.suffix in (".yaml", ".yml") or os.sep in exp:
        if p.is_file():
            return p
        raise UserError(f"experiment file {exp} does not exist")
    for d in experiments_dirs():
        if (d / f"{exp}.yaml").is_file():
            return d / f"{exp}.yaml"
    known = sorted({q.stem for d in experiments_dirs() if d.is_dir() for q in d.glob("*.yaml")})
    raise UserError(f"unknown experiment {exp!r}; choose from {', '.join(known) or '(none found)'}")


def _one_line(e: OmegaConfBaseException) -> str:
    msg = (getattr(e, "msg", None) or str(e)).splitlines()[0]
    key = getattr(e, "full_key", None)
    return f"{key}: {msg}" if key else msg


def load(exp: str | None, overrides: list[str] = ()) -> Config:
    """Defaults <- experiment YAML (a name in experiments/ or a path) <- key=value overrides."""
    conf = OmegaConf.structured(Config)
    name = None
    try:
        if exp:
            path = find_experiment(exp)
            name = path.stem
            loaded = OmegaConf.load(path)
            if not isinstance(loaded, type(conf)) and loaded is not None:
                raise UserError(f"experiment file {path} must hold a mapping of keys")
            conf = OmegaConf.merge(conf, loaded or {})
        for item in overrides:
            if "=" not in item:
                raise UserError(f"override {item!r} must look like key=value")
        conf.merge_with_dotlist(list(overrides))
        cfg: Config = OmegaConf.to_object(conf)
    except OmegaConfBaseException as e:
        raise UserError(_one_line(e)) from None
    except Exception as e:  # YAML syntax errors and the like
        if isinstance(e, UserError):
            raise
        raise UserError(f"{exp}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    if cfg.run.name is None:
        cfg.run.name = name or "default"
    check(cfg)
    return cfg


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_yaml(path: str | Path) -> Config:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path)))


def resolve_schedule(cfg: Config):
    """The validated schedule (with comms) the config asks for."""
    from ppx import schedules

    p = cfg.pipeline
    if p.schedule.endswith(".csv"):
        return schedules.from_csv(p.schedule)
    name = schedules.TORCH_SCHEDULES.get(p.schedule, p.schedule)  # torch's schedules: ppx's list of the same family
    return schedules.build(name, p.stages, p.microbatches, virtual_stages(cfg))


def virtual_stages(cfg: Config) -> int:
    """pipeline.virtual_stages, or the schedule's default (2 for interleaved ones, else 1)."""
    v = cfg.pipeline.virtual_stages
    if v is not None:
        return v
    return 2 if cfg.pipeline.schedule in ("interleaved_1f1b", "torch_interleaved1f1b") else 1


def check(cfg: Config) -> None:
    """Cross-field rules; raise UserError with one line naming the key."""
    from ppx import models
    from ppx.models.split import split_layers

    p, m, t = cfg.pipeline, cfg.model, cfg.train
    if p.stages < 1:
        raise UserError(f"pipeline.stages must be >= 1, got {p.stages}")
    if p.microbatches < 1:
        raise UserError(f"pipeline.microbatches must be >= 1, got {p.microbatches}")
    if t.batch_size < 1:
        raise UserError(f"train.batch_size must be >= 1, got {t.batch_size}")
    if t.batch_size % p.microbatches:
        raise UserError(
            f"train.batch_size={t.batch_size} is not divisible by pipeline.microbatches={p.microbatches}"
        )
    if t.steps < 1:
        raise UserError(f"train.steps must be >= 1, got {t.steps}")
    if not 0 <= t.lr < float("inf"):
        raise UserError(f"train.lr must be a finite number >= 0, got {t.lr}")
    if cfg.runtime.timeout_s <= 0:
        raise UserError(f"runtime.timeout_s must be > 0, got {cfg.runtime.timeout_s}")
    if cfg.runtime.recv_lookahead < -1:
        raise UserError(f"runtime.recv_lookahead must be -1 (all at the first wait) or >= 0, got {cfg.runtime.recv_lookahead}")
    if cfg.runtime.threads_per_rank < 1:
        raise UserError(f"runtime.threads_per_rank must be >= 1, got {cfg.runtime.threads_per_rank}")
    if m.hidden < 1 or m.layers < 1:
        raise UserError("model.hidden and model.layers must be >= 1")
    if m.kind == "transformer":
        if m.heads < 1 or m.ffn_mult < 1:
            raise UserError(f"model.heads and model.ffn_mult must be >= 1, got {m.heads} and {m.ffn_mult}")
        if m.hidden % m.heads:
            raise UserError(f"model.hidden={m.hidden} is not divisible by model.heads={m.heads}")
        if m.seq_len < 2 or m.vocab_size < 2:
            raise UserError("model.seq_len and model.vocab_size must be >= 2")
    sched = resolve_schedule(cfg)
    if p.schedule.endswith(".csv") and (sched.num_ranks != p.stages or sched.num_microbatches != p.microbatches):
        raise UserError(
            f"pipeline.schedule {p.schedule} is for {sched.num_ranks} ranks and {sched.num_microbatches} "
            f"microbatches, but pipeline.stages={p.stages} and pipeline.microbatches={p.microbatches}"
        )
    num_stages = sched.num_stages
    from ppx.models.costs import stage_costs_ms

    # other kinds ignore the costs, but a value of the wrong type is an error, not a silent no-op
    stage_costs_ms(m, num_stages if m.kind == "synthetic" else None)
    split_layers(m.layers, num_stages, p.layers_per_stage)
    if p.split == "tracer" and m.kind not in models.TRACEABLE:
        raise UserError(f"pipeline.split=tracer cannot trace model.kind={m.kind} (its stages sleep inside a custom "
                        "autograd Function); use mlp or transformer, or pipeline.split=layers")
    if cfg.instrument.timeline_steps < 1:
        raise UserError(f"instrument.timeline_steps must be >= 1, got {cfg.instrument.timeline_steps}")
    if cfg.logging.progress_every < 0:
        raise UserError(f"logging.progress_every must be >= 0, got {cfg.logging.progress_every}")
    prof = cfg.profile
    if min(prof.wait, prof.warmup, prof.repeat) < 0 or prof.active < 1:
        raise UserError("profile.wait, profile.warmup and profile.repeat must be >= 0 and profile.active >= 1")
    window = prof.wait + prof.warmup + prof.active
    if prof.enabled and cfg.train.steps < window:
        raise UserError(f"profile.enabled: the profiler records steps {prof.wait + prof.warmup}..{window - 1} "
                        f"(profile.wait + profile.warmup + profile.active = {window}) but train.steps={cfg.train.steps}; "
                        f"raise train.steps or shrink the profile window")
    if cfg.runtime.inject_fault is not None:
        from ppx.faults import parse_fault

        _, action = parse_fault(cfg.runtime.inject_fault)
        if not action.op.is_compute or not any(a == action for row in sched.actions for a in row):
            raise UserError(f"runtime.inject_fault={cfg.runtime.inject_fault}: {action} is not an action of this "
                            f"{sched.name} schedule ({sched.num_stages} stages, {sched.num_microbatches} microbatches); "
                            "faults fire on compute actions (F, B, I, W)")
    name = cfg.run.name or ""
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise UserError(f"run.name={name!r} must be a plain folder name (no '/', not '.' or '..'): runs go to "
                        "<run.root>/<run.name>/<id>; use run.root or run.dir to put them elsewhere")
