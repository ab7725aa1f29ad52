"""How each stage of a run split its backward (summary.json's ``split_backward``, from
``train.split_backward``), as text: one console line and the rows of report.html's table."""

from __future__ import annotations

from ppx.units import byte_unit

HEADER = ["stage", "way", "stored layers", "held from I to W, a microbatch", "I frees (measured)", "why"]


def _sizes(info: dict) -> tuple[str, str] | None:
    """(the stores' bytes, the graph's) a microbatch, as auto weighed them, in one unit."""
    store, graph = info.get("store_bytes"), info.get("graph_bytes")
    if store is None or graph is None:
        return None
    unit, size = byte_unit(max(store, graph))
    return f"{store / size:.2f} {unit}", f"{graph / size:.2f} {unit}"


def split_rows(summary: dict) -> list[list[str]]:
    """One row per split stage: [stage, way, stored layers, bytes held, share I frees, why];
    none when the run split no backward."""
    shares = summary.get("input_freed_share") or []
    rows = []
    for stage, info in (summary.get("split_backward") or {}).items():
        k = int(stage)
        share = f"{shares[k]:.0%}" if k < len(shares) and shares[k] is not None else ""
        layers = str(info["stored_layers"]) if info.get("mode") == "store" and "stored_layers" in info else ""
        sizes = _sizes(info)
        held = f"stores {sizes[0]}, the graph {sizes[1]}" if sizes else ""
        why = info.get("why", "")
        if info.get("whole_microbatches"):
            why += f"; microbatches {', '.join(map(str, info['whole_microbatches']))} whole (B)"
        rows.append([stage, info.get("mode", ""), layers, held, share, why])
    return rows


def split_line(summary: dict) -> str | None:
    """``ppx: split backward: stage 0 whole (...), stage 1 store (...)``, or None when the run
    split no backward."""
    parts = []
    for stage, info in (summary.get("split_backward") or {}).items():
        mode = info.get("mode", "?")
        if mode == "whole":
            detail = info.get("why") or "each I followed at once by its W: one backward, in the I"
        elif mode == "store" and "stored_layers" in info:
            n = info["stored_layers"]
            whose = "1 layer's" if n == 1 else f"{n} layers'"
            detail = f"{whose} inputs and output gradients from I to W"
            sizes = _sizes(info)
            if sizes:
                detail += f": {sizes[0]} a microbatch against the graph's {sizes[1]}"
        else:
            detail = info.get("why", "")
        whole = info.get("whole_microbatches")
        if whole:  # a list that splits only some of the stage's microbatches (train.split_backward=drain)
            n = len(whole)
            detail += ("; " if detail else "") + f"{n} microbatch{'es' if n != 1 else ''} whole (B)"
        parts.append(f"stage {stage} {mode}" + (f" ({detail})" if detail else ""))
    return "ppx: split backward: " + ", ".join(parts) if parts else None
