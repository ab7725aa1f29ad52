"""A plan's files: plan.json (inputs, every candidate, skipped shapes, best), plan.md
(inputs, ranked table, the best and how to run it, the picture) and best.csv (the best
fitting candidate's schedule, compute only: `ppx run` places its own sends and receives)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from ppx import files
from ppx.plan import table
from ppx.plan.builders import build
from ppx.plan.evaluate import Result
from ppx.plan.inputs import PlanInputs
from ppx.plan.space import Skipped
from ppx.schedules.csv_io import write_csv
from ppx.units import format_bytes


def write_json(
    path: Path,
    inputs: PlanInputs,
    results: list[Result],
    skipped: list[Skipped],
    best: Result | None,
    notes: list[str],
    close: list[Result],
    commands: list[str] | None = None,
) -> None:
    """``close``: the candidates named too close to the best to call (their places in
    "candidates", as "close_to_best"); ``commands``: each candidate's `ppx run` command."""
    commands = commands or [None] * len(results)
    data = {
        "inputs": inputs.to_json(),
        "candidates": [{**r.to_json(), "command": c} for r, c in zip(results, commands)],
        "skipped": [asdict(s) for s in skipped],
        "best": {**best.to_json(), "command": commands[results.index(best)]} if best else None,
        "close_to_best": [results.index(r) for r in close],
        "notes": notes,
    }
    files.write_json(path, data, indent=1)


def _inputs_lines(inputs: PlanInputs) -> list[str]:
    per = "layer" if inputs.per_layer else "stage"
    ms = lambda xs: ", ".join(f"{x * 1e3:.4g}" for x in xs)  # noqa: E731
    lines = [
        f"- costs from: {inputs.source}, per {per} ({inputs.units} {per}s)",
        f"- forward ms: {ms(inputs.fwd_s)}",
        *(
            [
                f"- input-gradient backward ms: {ms(inputs.bwd_s)}",
                f"- weight-gradient backward ms: {ms(inputs.wgrad_s)}",
            ]
            if inputs.split_known
            else [f"- backward ms (whole: I and W not measured apart): {ms(inputs.bwd_s)}"]
        ),
        f"- hand-off ms: {inputs.p2p_s * 1e3:.4g}; overhead per action ms: {inputs.overhead_s * 1e3:.4g}",
        f"- transport: {inputs.transport} (receive lookahead {inputs.lookahead})",
    ]
    if inputs.run_units is not None:
        how = (
            "each weighed by its forward FLOPs (times), the bytes a stage holding it keeps (activations, under the "
            "run's train.recompute) and its parameter bytes (a tied weight held once a stage)"
            if inputs.unit_weights is not None
            else "in equal shares (the model's units could not be weighed)"
        )
        lines.append(
            f"- model units per measured stage: {', '.join(map(str, inputs.run_units))}; other stage counts "
            f"take the units their commands split them into, {how}"
        )
    if inputs.act_bytes:
        lines.append(f"- saved bytes per microbatch: {', '.join(format_bytes(b) for b in inputs.act_bytes)}")
    if inputs.input_share:
        lines.append(
            f"- share of them an I frees (stores to W; below 0: holds more, a graph with its output gradient or a recomputed forward): "
            f"{', '.join(f'{s:.2f}' for s in inputs.input_share)}"
        )
    if inputs.param_bytes:
        lines.append(
            f"- weights + gradients + optimizer state bytes: {', '.join(format_bytes(b) for b in inputs.param_bytes)}"
        )
    budget = "none" if inputs.budget_bytes is None else format_bytes(inputs.budget_bytes)
    ranked = "steady-state step (the longest rank's own span)" if inputs.rank_by == "steady" else "sync step"
    return lines + [
        f"- memory budget per rank: {budget}",
        f"- ranked by: the {ranked} (--rank-by); both in the table: step = sync (every rank starting together, "
        "what ppx run measures), steady = the longest rank's own span (consecutive steps, no rank waiting at a "
        "step boundary)",
    ]


def write_md(
    path: Path,
    inputs: PlanInputs,
    results: list[Result],
    skipped: list[Skipped],
    best: Result | None,
    how: list[str],
    notes: list[str],
) -> None:
    parts = ["# ppx plan", "", "## Inputs", "", *_inputs_lines(inputs), ""]
    parts += [f"> {n}" for n in notes] + ([""] if notes else [])
    parts += ["## Candidates, ranked", "", table.markdown(results, inputs.microbatch_size), ""]
    if best:
        parts += [
            "## Best",
            "",
            f"**{best.label()}**: predicted step {best.step_s * 1e3:.2f} ms (sync), steady-state "
            f"{best.steady_s * 1e3:.2f} ms, bubble {best.bubble:.1%}"
            + (f", peak {format_bytes(best.peak_max)} per rank." if best.sized else " (no bytes given: no peak)."),
            "",
        ]
        parts += ["```", *how, "```", ""]
    else:
        parts += ["## Best", "", "Nothing fits the memory budget; no best.csv.", ""]
    parts += ["![step time against peak memory](plan.png)", ""]
    if skipped:
        parts += ["## Skipped shapes", ""]
        parts += [f"- {s.schedule} p={s.p} m={s.m} v={s.v}: {s.reason}" for s in skipped] + [""]
    files.write_whole(path, "\n".join(parts))


def write_best(path: Path, best: Result, inputs: PlanInputs) -> None:
    """The best candidate's schedule, compute only, in torch's CSV form."""
    write_csv(build(best.schedule, best.p, best.m, best.v, inputs).compute_only(), path)
