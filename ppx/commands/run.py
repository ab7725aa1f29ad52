"""`ppx run`: one experiment, as a torchrun job (or inside one started by torchrun or srun)."""

from __future__ import annotations

import os
import shlex
import signal
import sys

from ppx.errors import UserError


def cmd_run(args) -> int:
    from ppx.launch.closed_stdout import survive_closed_output
    from ppx.launch.early_agent import EarlyAgent

    survive_closed_output()  # (ppx run ... 2>&1 | head -n 0: the run goes on, its lines to /dev/null)
    # torchrun's agent importing torch (in a process of its own) while the experiment is checked
    agent = EarlyAgent.start(args.experiment, args.overrides)
    try:
        return _run(args, agent)
    finally:
        if agent is not None:
            refused = agent.refused()
            if refused:
                print(refused, file=sys.stderr)
            agent.stop()


def _run(args, agent) -> int:
    from ppx import config
    from ppx.config import resolve_schedule
    from ppx.launch import devices, processes, slurm
    from ppx.launch.claim import check_free, claim, write_config
    from ppx.launch.served_agent import SERVER_ENV

    sweep = os.environ.pop("PPX_SWEEP_PID", None)  # (the sweep's pid, for its point alone: `ppx.launch.sweep`)
    cfg = config.load(args.experiment, args.overrides)
    command = " ".join(shlex.quote(a) for a in ["ppx", "run", args.experiment, *args.overrides])
    mode = processes.launched_by()
    if mode is not None:
        if "TORCHELASTIC_RUN_ID" in os.environ:
            _follow_the_agent()
        if mode == "srun":
            slurm.adopt_srun_env()
        have = int(os.environ["WORLD_SIZE"])
        os.environ.setdefault("PPX_COMMAND", command)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
        device, notice = devices.choose_device(cfg.runtime.device, local, multi_node=have != local)
        if device == "cpu":  # (before this rank's first CUDA call: `devices.CPU_ONLY`)
            os.environ.update(devices.CPU_ONLY)
        rank0 = os.environ.get("RANK") == "0"
        if notice and rank0:
            print(notice, file=sys.stderr)
        # every rank re-loads the same experiment and overrides, so all agree on the fallback
        cfg = _cpu_fallback(cfg, args, notice, rank0) or cfg
        sched = resolve_schedule(cfg)
        stages, world = _processes(cfg, sched)
        for line in _notes(cfg, sched, _entries(cfg)) if rank0 else ():
            print(line, file=sys.stderr)
        if have != world:
            want = f"pipeline.stages={stages}" + (f" x parallel.data={cfg.parallel.data}" if world != stages else "")
            raise UserError(
                f"{want} but this job has {have} processes (WORLD_SIZE); start one process per stage"
                + (" and replica" if world != stages else "")
            )
        from ppx.launch.worker import run_rank

        return run_rank(cfg, None, device)

    if not processes.follow_parent(sweep):  # a sweep's point: ended when the sweep dies
        print(f"ppx: stopped: the ppx sweep that started this run (pid {sweep}) has ended", file=sys.stderr)
        return 128 + 15  # (as a point of a sweep stopped by SIGTERM)
    check_free(cfg)  # (before the device's notice: a run that cannot start says one line)
    sched = resolve_schedule(cfg)
    device, notice = devices.choose_device(cfg.runtime.device, _processes(cfg, sched)[1])
    if notice:
        print(notice, file=sys.stderr)
    fell = _cpu_fallback(cfg, args, notice, True)
    if fell is not None:
        cfg, sched = fell, resolve_schedule(fell)
    world = _processes(cfg, sched)[1]
    entries = _entries(cfg)
    for line in _notes(cfg, sched, entries):
        print(line, file=sys.stderr)
    from ppx.launch.open_files import ensure_open_files
    from ppx.launch.stops import stops_held
    from ppx.launch.supervisor import supervise

    ensure_open_files(world)  # (before the claim: a job that cannot open its files leaves no run)
    with stops_held() as early:  # (a stop from here on leaves the claimed run marked: incomplete.txt)
        run_dir = claim(cfg)
        write_config(run_dir, cfg, [e.pipeline.schedule for e in entries])
        env = processes.worker_env(device, cfg.runtime.threads_per_rank, command)
        fork = device == "cpu" and cfg.runtime.fork_ranks and sys.platform.startswith("linux")  # CUDA cannot fork
        server = agent.listening() if agent is not None and fork and cfg.runtime.early_agent else None
        if server is not None:
            env[SERVER_ENV] = server
        elif agent is not None:  # (a job whose ranks are started: its imports would only take a core)
            agent.stop()
        if world == 1 and not fork:
            # one rank that cannot be forked (a GPU's): in this process, where a torchrun job would
            # import torch and start CUDA once more (a stop signal ends it as a watched job's would)
            os.environ.update(env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
            from ppx.launch.in_process import run_in_process

            return run_in_process(cfg, run_dir, device, early)
        # watched to its end: a frozen rank, a killed one, a SIGTERM to us each end it and are explained
        # (one CPU rank too: forked from torchrun's agent, it costs no more than running it here)
        command = processes.torchrun_command(world, run_dir, fork)
        return supervise(command, env, run_dir, world, cfg.runtime.timeout_s, early)


def _entries(cfg) -> list:
    """The configs the run's ``run.paired`` entries run (checked with the run's)."""
    from ppx.config.paired import entry_config

    return [entry_config(cfg, e) for e in cfg.run.paired]


def _notes(cfg, sched, entries: list) -> list[str]:
    """The notes a run prints before it starts (stderr, rank 0's), once each: ``sched`` is the
    run's list, ``entries`` its run.paired entries' configs."""
    lines = (
        _other_kinds_keys(cfg),
        _changes_nothing(cfg, sched),
        _recompute_without_backward(cfg, sched),
        _forward_only_csv(cfg, sched),
        *_out_of_order(cfg, sched, entries),
        _forward_unchecked(cfg),
    )
    return list(dict.fromkeys(line for line in lines if line))


def _forward_unchecked(cfg) -> str | None:
    """A note where your model's forward could not be read (torch.fx fails on it), so ppx
    checked that it calls its units in turn, as either split runs them, on one microbatch's path
    only (`module_chain.forward_run`), or, where it could not run it either, not at all."""
    if cfg.model.kind != "module":
        return None
    from ppx.models import module_chain, module_forward, module_spec

    described = module_spec.described(cfg.model)
    why = module_forward.untraced(*described)
    if why is None:
        return None
    said = f"ppx: note: torch.fx cannot trace the forward of model.module={cfg.model.module} ({why}), so ppx"
    mbs = cfg.microbatch_size()
    ran = module_chain.forward_run(cfg.model, mbs, described)
    if isinstance(ran, str):
        return (
            f"{said} did not check that it only calls model.units in turn (nor could it run it once: {ran}): "
            "ppx runs them so, whatever the forward does"
        )
    return (
        f"{said} checked that it only calls model.units in turn by running it once, on one microbatch: a path "
        "another batch takes through it is not checked (ppx runs the units in turn, whatever the forward does)"
    )


def _forward_only_csv(cfg, sched) -> str | None:
    """A note where the run's CSV holds no backward: it runs forward only and changes no weight
    (which a list named forward_only says by its name)."""
    from ppx.schedules import is_csv

    if not is_csv(cfg.pipeline.schedule) or sched.training:
        return None
    return (
        f"ppx: note: {cfg.pipeline.schedule} holds no backward (B, or I and W): the run computes forwards and "
        "losses only and changes no weight, as pipeline.schedule=forward_only does"
    )


def _out_of_order(cfg, sched, entries: list) -> list[str]:
    """A note for the run's list, and each ``run.paired`` entry's, that sums its microbatches
    out of microbatch order (a CSV of one's own: every family's list keeps it), so that losses
    which differ from another schedule's in the last digits are not taken for a wrong gradient."""
    from ppx.config.resolve import sum_order_note

    configs = [("", cfg, sched)] + [(f"run.paired {e!r}: ", c, None) for e, c in zip(cfg.run.paired, entries)]
    notes = []
    for label, c, built in configs:
        note = sum_order_note(c, built)
        if note:
            notes.append(f"ppx: note: {label}{c.pipeline.schedule} {note}")
    return notes


def _other_kinds_keys(cfg) -> str | None:
    """A note naming the model keys set away from their defaults that only another model.kind
    reads (its meaning names that kind alone: ``hf: ...``): ``model.hf_config=llama`` on an MLP
    trained the MLP without a word, where the user had left out ``model.kind=hf``."""
    from dataclasses import MISSING, fields

    from ppx.models import KINDS

    unread = {}
    for f in fields(cfg.model):
        kind = f.metadata.get("help", "").split(":", 1)[0]
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if kind in KINDS and kind != cfg.model.kind and getattr(cfg.model, f.name) != default:
            unread[f.name] = kind
    if not unread:
        return None
    named = ", ".join(f"model.{k}={getattr(cfg.model, k)} (model.kind={kind}'s)" for k, kind in unread.items())
    verb = "changes" if len(unread) == 1 else "change"
    return f"ppx: note: {named} {verb} nothing here: this run's model.kind is {cfg.model.kind}"


def _changes_nothing(cfg, sched) -> str | None:
    """A note where the config sets ``train.split_backward`` for a schedule that splits no
    backward (an experiment's setting, kept across a sweep of schedules: not an error)."""
    way = cfg.train.split_backward
    if way == "auto" or sched.splits_backward:
        return None
    return f"ppx: note: train.split_backward={way} changes nothing here: {cfg.pipeline.schedule} splits no backward into I and W"


def _recompute_without_backward(cfg, sched) -> str | None:
    """A note where the config sets ``train.recompute`` for a list that holds no backward
    (forward_only, a CSV of forwards): recomputation re-runs a forward in a backward, so here
    it changes nothing (an experiment's setting, kept across a sweep of schedules)."""
    modes = cfg.train.recompute
    if sched.training or all(m == "none" for m in ([modes] if isinstance(modes, str) else modes)):
        return None
    given = modes if isinstance(modes, str) else f"[{', '.join(str(m) for m in modes)}]"
    return (
        f"ppx: note: train.recompute={given} changes nothing here: {cfg.pipeline.schedule} runs no backward, "
        "where recomputation re-runs a forward"
    )


def _processes(cfg, sched) -> tuple[int, int]:
    """(pipeline ranks, processes of the job: pipeline ranks x parallel.data) of ``cfg`` running
    its list ``sched``."""
    return sched.num_ranks, sched.num_ranks * cfg.parallel.data


def _follow_the_agent() -> None:
    """A rank torchrun started ends with its agent (PR_SET_PDEATHSIG: one killed outright had
    left it running) and leaves a job manager's warning (SIGUSR1, SIGUSR2, which SLURM may send
    every process of a step) to it: ppx's torchrun stops the job and SIGTERMs its ranks, and
    torch's own dies of it, which ends them too."""
    from ppx.launch import processes
    from ppx.launch.stops import WARNINGS

    for sig in WARNINGS:
        signal.signal(sig, signal.SIG_IGN)
    processes.follow_parent(str(os.getppid()))


def _cpu_fallback(cfg, args, notice: str | None, speak: bool):
    """The config once the run fell back to CPU (``notice``) and the experiment has
    runtime.cpu_fallback: re-loaded with those overrides before the command line's, named in
    one notice line; None when nothing changes."""
    from ppx import config

    if not notice or not cfg.runtime.cpu_fallback:
        return None
    fallback = list(cfg.runtime.cpu_fallback)
    try:
        cfg = config.load(args.experiment, [*fallback, *args.overrides])
    except UserError as e:
        raise UserError(f"runtime.cpu_fallback: {e}") from None
    if speak:  # what applies: an entry whose key the command line sets again is the command line's
        given = {o.split("=", 1)[0] for o in args.overrides}
        applies = [f for f in fallback if f.split("=", 1)[0] not in given]
        print(
            f"ppx: on CPU, runtime.cpu_fallback applies: {' '.join(applies) or '(nothing the command line leaves)'}",
            file=sys.stderr,
        )
    return cfg
