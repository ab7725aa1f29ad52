"""The cross-field rules of a config, one section at a time; each failure is a UserError
whose one line names the key. `check` runs them in a fixed order, so the first problem
named is always the same."""

from __future__ import annotations

from ppx import models, schedules
from ppx.config.fault_spec import parse_fault
from ppx.config.resolve import resolve_schedule
from ppx.config.schema import MAX_LAYERS, Config
from ppx.errors import ScheduleError, UserError
from ppx.schedules.ir.schedule import Schedule

MAX_TIMEOUT_S = 1e9  # runtime.timeout_s's ceiling (31 years): a timedelta holds it
MIN_TIMEOUT_S = 1.0  # and its floor: a heartbeat a second; shorter ended healthy runs mid-action


def check(cfg: Config) -> None:
    """Every rule; raise UserError with one line naming the key."""
    check_shape(cfg)
    check_parallel(cfg)
    check_train(cfg)
    check_runtime(cfg)
    check_model(cfg)
    check_stage_count(cfg)
    sched = resolve_schedule(cfg)
    check_schedule(cfg, sched)
    check_instrument(cfg)
    check_profile(cfg)
    check_fault(cfg, sched)
    check_run(cfg)
    check_wandb(cfg)


def check_stage_count(cfg: Config) -> None:
    """More stages than the model has units fails at the split: say so before the schedule's
    list is built (100000 stages' would take minutes); the split's own message."""
    p = cfg.pipeline
    if schedules.is_csv(p.schedule):
        return  # (a CSV's stages come from its file)
    if p.virtual_stages is not None and (why := schedules.virtual_stages_error(p.schedule, p.virtual_stages)):
        raise ScheduleError(why)  # (before the count it gives meets the layers)
    if p.layers_per_stage is not None:
        return  # (checked against the stages)
    v = schedules.default_virtual(p.schedule) if p.virtual_stages is None else p.virtual_stages
    n = p.stages * v
    if n > models.unit_count(cfg.model):  # the split's line (several stages a rank: the count is theirs)
        counted = f"pipeline.stages={p.stages} x {v} stages a rank, {p.schedule}" if v > 1 else ""
        models.stage_units(cfg.model, n, counted=counted)


def check_shape(cfg: Config) -> None:
    p, t = cfg.pipeline, cfg.train
    if p.stages < 1:
        raise UserError(f"pipeline.stages must be >= 1, got {p.stages}")
    if p.microbatches < 1:
        raise UserError(f"pipeline.microbatches must be >= 1, got {p.microbatches}")
    if t.batch_size < 1:
        raise UserError(f"train.batch_size must be >= 1, got {t.batch_size}")
    if t.batch_size % p.microbatches:
        raise UserError(f"train.batch_size={t.batch_size} is not divisible by pipeline.microbatches={p.microbatches}")


def check_parallel(cfg: Config) -> None:
    d, p = cfg.parallel.data, cfg.pipeline
    if d < 1:
        raise UserError(f"parallel.data must be >= 1, got {d}")
    if cfg.train.batch_size % (d * p.microbatches):
        raise UserError(
            f"train.batch_size={cfg.train.batch_size} (the global batch) does not split into parallel.data={d} "
            f"replicas x pipeline.microbatches={p.microbatches}"
        )
    if cfg.parallel.data_shard and d == 1:
        raise UserError("parallel.data_shard=true shards over the replicas: it needs parallel.data > 1")
    if d > 1 and schedules.runs_on_torch(p.schedule, p.executor):
        where, instead = [], []
        if schedules.is_torch(p.schedule):  # ppx's list of its order runs on ppx's executor
            where.append(f"torch's pipeline.schedule={p.schedule}")
            instead.append(f"pipeline.schedule={schedules.family_name(p.schedule)}")
        if p.executor == "torch":
            where.append("pipeline.executor=torch")
            instead.append("pipeline.executor=ppx")
        where, instead = " with ".join(where), " ".join(instead)
        raise UserError(
            f"parallel.data={d} runs on ppx's executor only, not under {where}; use {instead} or parallel.data=1"
        )


def check_train(cfg: Config) -> None:
    t = cfg.train
    if t.steps < 1:
        raise UserError(f"train.steps must be >= 1, got {t.steps}")
    if not 0 <= t.lr < float("inf"):
        raise UserError(f"train.lr must be a finite number >= 0, got {t.lr}")


def check_runtime(cfg: Config) -> None:
    rt = cfg.runtime
    if not MIN_TIMEOUT_S <= rt.timeout_s <= MAX_TIMEOUT_S:  # (NaN too: the process group's timedelta needs a number)
        raise UserError(
            f"runtime.timeout_s must be seconds from {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g}, got {rt.timeout_s}"
        )
    if rt.recv_lookahead < -1:
        raise UserError(f"runtime.recv_lookahead must be -1 (all at the first wait) or >= 0, got {rt.recv_lookahead}")
    if rt.gc_steps < 0:
        raise UserError(f"runtime.gc_steps must be >= 0 (0: Python's automatic collection), got {rt.gc_steps}")
    if rt.threads_per_rank < 1:
        raise UserError(f"runtime.threads_per_rank must be >= 1, got {rt.threads_per_rank}")
    for item in rt.cpu_fallback:
        if "=" not in item or item.startswith("runtime.cpu_fallback"):
            raise UserError(f"runtime.cpu_fallback: {item!r} must look like key=value (a key other than itself)")
    # their keys and types: `ppx.config.loading.load`, on every machine


def check_model(cfg: Config) -> None:
    from ppx.models import KINDS

    m = cfg.model
    if m.kind not in KINDS:
        raise UserError(f"model.kind: Invalid value {m.kind!r}; choose from {', '.join(KINDS)}")
    if m.hidden < 1 or m.layers < 1:
        raise UserError("model.hidden and model.layers must be >= 1")
    if m.layers > MAX_LAYERS:
        raise UserError(
            f"model.layers={m.layers}: ppx builds models of at most {MAX_LAYERS} layers (each a module of its own, "
            "split by FLOPs in a time that grows with their square)"
        )
    glued = [str(k) for k, v in (m.args or {}).items() if ":" in str(k) and v is None]
    if glued:  # YAML reads {width:32} as one key "width:32" with no value
        key, value = glued[0].split(":", 1)
        raise UserError(
            f"model.args: {glued[0]!r} is a key with no value; write {{{key}: {value}}} with a space after "
            f"the colon, or model.args.{key}={value}"
        )
    if m.kind == "hf":  # llama's own keys: a Hugging Face model reads these from its config
        for ours, theirs in (("kv_heads", "num_key_value_heads"), ("ffn_hidden", "intermediate_size")):
            if getattr(m, ours) is not None:
                raise UserError(
                    f"model.{ours} is llama's key; model.kind=hf reads it from its config: give "
                    f"model.hf_overrides.{theirs}={getattr(m, ours)}"
                )
    if m.kind in ("transformer", "llama"):  # the decoders: attention heads over tokens of a vocabulary
        if m.kind == "transformer" and (m.heads < 1 or m.ffn_mult < 1):
            raise UserError(f"model.heads and model.ffn_mult must be >= 1, got {m.heads} and {m.ffn_mult}")
        if m.heads < 1:
            raise UserError(f"model.heads must be >= 1, got {m.heads}")
        if m.hidden % m.heads:
            raise UserError(f"model.hidden={m.hidden} is not divisible by model.heads={m.heads}")
        if m.seq_len < 2 or m.vocab_size < 2:
            raise UserError("model.seq_len and model.vocab_size must be >= 2")
    if m.kind == "llama":
        check_llama(m)
    models.check(cfg)  # a loaded kind's own (model.kind=hf, module)


def check_llama(m) -> None:
    """llama's keys beside the decoders' shared ones (`check_model`)."""
    if (m.hidden // m.heads) % 2:
        raise UserError(
            f"model.hidden / model.heads = {m.hidden // m.heads} (the head dim) must be even: rotary embeddings "
            "turn pairs of dimensions"
        )
    if m.kv_heads is not None and (m.kv_heads < 1 or m.heads % m.kv_heads):
        raise UserError(f"model.kv_heads={m.kv_heads} must divide model.heads={m.heads} (grouped-query attention)")
    if m.ffn_hidden is not None and m.ffn_hidden < 1:
        raise UserError(f"model.ffn_hidden must be >= 1 (or null: Llama's rule), got {m.ffn_hidden}")
    if not 1 < m.rope_theta < float("inf"):
        raise UserError(f"model.rope_theta must be a finite number > 1, got {m.rope_theta}")


def check_schedule(cfg: Config, sched: Schedule) -> None:
    """The schedule against the rest: a CSV's shape, the known-cost model's per-stage costs,
    the layer split (and a loaded kind's checks of it) and the tracer."""
    from ppx import models
    from ppx.models.costs import stage_costs_ms

    p, m = cfg.pipeline, cfg.model
    if schedules.is_csv(p.schedule) and (sched.num_ranks != p.stages or sched.num_microbatches != p.microbatches):
        raise UserError(
            f"pipeline.schedule {p.schedule} is for {sched.num_ranks} ranks and {sched.num_microbatches} "
            f"microbatches, but pipeline.stages={p.stages} and pipeline.microbatches={p.microbatches}"
        )
    if schedules.is_csv(p.schedule) and p.virtual_stages is not None and set(sched.stages_held()) != {p.virtual_stages}:
        raise UserError(
            f"pipeline.schedule {p.schedule} places {sched.holding()}, but pipeline.virtual_stages={p.virtual_stages} "
            "(a CSV's own count holds: leave the key null)"
        )
    if p.executor == "torch" and not sched.training:
        raise UserError(
            f"pipeline.executor=torch runs training schedules: pipeline.schedule={p.schedule} holds no backward, "
            "which torch's executor wants of every microbatch; use pipeline.executor=ppx"
        )
    check_precision(cfg, sched)
    # other kinds ignore the costs, but a value of the wrong type is an error, not a silent no-op
    stage_costs_ms(m, sched.num_stages if m.kind == "synthetic" else None, p.layers_per_stage)
    models.split_of(cfg, sched.num_stages)
    models.check_split(cfg, sched.num_stages, sched.training)
    if p.split == "tracer" and m.kind not in models.TRACEABLE:
        why = {
            "synthetic": "its stages sleep inside a custom autograd Function",
            "hf": "ppx splits a Hugging Face model by its own units",
        }.get(m.kind, "it names no split points")
        raise UserError(
            f"pipeline.split=tracer cannot trace model.kind={m.kind} ({why}); use "
            f"{' or '.join(models.TRACEABLE)}, or pipeline.split=layers"
        )


def check_precision(cfg: Config, sched: Schedule) -> None:
    """``train.dtype`` and ``train.recompute`` (one mode, or one per stage); ppx's runtime
    runs them, torch's executor does not."""
    from ppx.models.costs import recompute_modes

    t, p = cfg.train, cfg.pipeline
    modes = recompute_modes(t.recompute, sched.num_stages)
    if schedules.runs_on_torch(p.schedule, p.executor):
        where = "pipeline.executor=torch" if p.executor == "torch" else f"pipeline.schedule={p.schedule}"
        if t.dtype != "fp32":
            raise UserError(
                f"train.dtype={t.dtype} runs in ppx's runtime only, not under {where}; use train.dtype=fp32"
            )
        if any(mode != "none" for mode in modes):
            raise UserError(f"train.recompute runs in ppx's runtime only, not under {where}; use train.recompute=none")
    check_split_backward(cfg, sched)


def check_split_backward(cfg: Config, sched: Schedule) -> None:
    """``train.split_backward=store`` where a split backward cannot store: the stores belong to
    ppx's runtime and to Linear layers, which torch's executor, the tracer's GraphModules and
    the known-cost model do not have (auto keeps the graph's way there, and says so)."""
    t, p = cfg.train, cfg.pipeline
    if t.split_backward != "store" or not sched.splits_backward:
        return
    why = None
    if schedules.runs_on_torch(p.schedule, p.executor):
        why = "torch's executor splits its backward its own way"
    elif p.split == "tracer":
        why = "pipeline.split=tracer makes GraphModules without Linear layers to store"
    elif cfg.model.kind == "synthetic":
        why = "the known-cost model has no Linear layers (its W costs model.wgrad_ms)"
    if why:
        raise UserError(f"train.split_backward=store cannot run here: {why}; use train.split_backward=auto or graph")


def check_instrument(cfg: Config) -> None:
    if cfg.instrument.timeline_steps < 1:
        raise UserError(f"instrument.timeline_steps must be >= 1, got {cfg.instrument.timeline_steps}")
    if cfg.instrument.memory_steps < 0:
        raise UserError(f"instrument.memory_steps must be >= 0 (0: every step), got {cfg.instrument.memory_steps}")
    if cfg.logging.progress_every < 0:
        raise UserError(f"logging.progress_every must be >= 0, got {cfg.logging.progress_every}")


def check_profile(cfg: Config) -> None:
    prof = cfg.profile
    if min(prof.wait, prof.warmup, prof.repeat) < 0 or prof.active < 1:
        raise UserError("profile.wait, profile.warmup and profile.repeat must be >= 0 and profile.active >= 1")
    window = prof.wait + prof.warmup + prof.active
    if prof.enabled and cfg.train.steps < window:
        raise UserError(
            f"profile.enabled: the profiler records steps {prof.wait + prof.warmup}..{window - 1} "
            f"(profile.wait + profile.warmup + profile.active = {window}) but train.steps={cfg.train.steps}; "
            f"raise train.steps or shrink the profile window"
        )


def check_fault(cfg: Config, sched: Schedule) -> None:
    if cfg.runtime.inject_fault is None:
        return
    _, action = parse_fault(cfg.runtime.inject_fault)
    if not action.op.is_compute or not any(a == action for row in sched.actions for a in row):
        raise UserError(
            f"runtime.inject_fault={cfg.runtime.inject_fault}: {action} is not an action of this "
            f"{sched.name} schedule ({sched.num_stages} stages, {sched.num_microbatches} microbatches); "
            "faults fire on compute actions (F, B, I, W)"
        )


def check_run(cfg: Config) -> None:
    name = cfg.run.name or ""
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise UserError(
            f"run.name={name!r} must be a plain folder name (no '/', not '.' or '..'): runs go to "
            "<run.root>/<run.name>/<id>; use run.root or run.dir to put them elsewhere"
        )


# what W&B's settings refuse in a project name (wandb.sdk.wandb_settings.Settings.validate_project)
WANDB_PROJECT_REFUSES = "/\\#?%:"


def check_wandb(cfg: Config) -> None:
    """What W&B's own settings refuse, its project name and tags, said before the run, not as
    a warning after it that it went without W&B."""
    wb = cfg.logging.wandb
    if wb.mode == "disabled":
        return
    project = wb.project or ""
    bad = [c for c in WANDB_PROJECT_REFUSES if c in project]
    if bad or len(project) > 128:
        why = f"refuses {' '.join(bad)} in a project name" if bad else "takes project names of 128 characters at most"
        raise UserError(f"logging.wandb.project={project!r}: W&B {why} (or logging.wandb.mode=disabled)")
    for tag in map(str, wb.tags):
        if not 1 <= len(tag) <= 64:
            raise UserError(f"logging.wandb.tags: {tag[:24]!r} has {len(tag)} characters; W&B takes tags of 1 to 64")
