"""Where a Hugging Face causal LM keeps the parts ppx splits it into, found from the model
itself (built on the meta device, no memory): the token embedding (and GPT-2's learned
positions and dropout), the decoder layers (the base model's ModuleList), the final norm, the
LM head, and the rotary embedding every layer is handed. Any architecture laid out this way
splits with no change to ppx; one that is not is refused in one line, naming what is missing."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ppx.errors import UserError

NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_norm", "final_layer_norm")


@dataclass
class Parts:
    base_name: str  # the base model's attribute in the causal LM ("model", "transformer")
    head_name: str  # the LM head's attribute in the causal LM ("lm_head")
    embed: tuple[str, nn.Module]  # (attribute in the base model, module)
    positions: tuple[str, nn.Module] | None  # GPT-2's wpe
    dropout: tuple[str, nn.Module] | None  # GPT-2's drop
    layers: tuple[str, nn.ModuleList]
    norm: tuple[str, nn.Module]
    head: nn.Module
    rotary: tuple[str, nn.Module] | None  # handed to every layer as position_embeddings
    tied: bool  # the head's weight is the token embedding's


def find(full: nn.Module, num_layers: int) -> Parts:
    """The parts of ``full`` (a transformers ``*ForCausalLM``); UserError naming what ppx
    cannot find."""
    arch = type(full).__name__

    def refuse(why: str) -> UserError:
        return UserError(
            f"model.kind=hf: ppx cannot split {arch}: {why} (model.kind=module splits any nn.Module by its units)"
        )

    base_name = getattr(full, "base_model_prefix", None)
    base = getattr(full, base_name, None) if base_name else None
    head = full.get_output_embeddings() if hasattr(full, "get_output_embeddings") else None
    if base is None or head is None:
        raise refuse("no base model with an LM head beside it")
    head_name = next((n for n, m in full.named_children() if m is head), None)
    embed = base.get_input_embeddings()
    children = dict(base.named_children())
    named = {id(m): n for n, m in children.items()}
    lists = [(n, m) for n, m in children.items() if isinstance(m, nn.ModuleList) and len(m) == num_layers]
    if len(lists) != 1:
        raise refuse(f"not one ModuleList of its {num_layers} decoder layers in {type(base).__name__}")
    rotary = next(((n, m) for n, m in children.items() if "rotary" in n.lower()), None)
    positions = [(n, m) for n, m in children.items() if isinstance(m, nn.Embedding) and m is not embed]
    dropouts = [(n, m) for n, m in children.items() if isinstance(m, nn.Dropout)]
    norms = [(n, children[n]) for n in NORM_NAMES if n in children]
    known = {id(embed), id(lists[0][1])} | {id(m) for _, m in positions + dropouts + norms}
    known |= {id(rotary[1])} if rotary else set()
    rest = [n for n, m in children.items() if id(m) not in known and any(True for _ in m.parameters())]
    if id(embed) not in named or len(norms) != 1 or len(positions) > 1 or len(dropouts) > 1 or rest or not head_name:
        why = f"parts it has beyond embedding, layers and final norm: {', '.join(rest)}" if rest else "no final norm"
        raise refuse(why)
    if rotary is None and not positions:
        raise refuse("neither rotary nor learned position embeddings")
    for what, module in [("the embedding", embed), ("the final norm", norms[0][1])] + [
        (f"layer {k}", m) for k, m in enumerate(lists[0][1])
    ]:
        buffers = [n for n, _ in module.named_buffers()]
        if buffers:
            raise refuse(f"{what} holds buffers ({', '.join(buffers)}) ppx cannot initialise")
    return Parts(
        base_name,
        head_name,
        (named[id(embed)], embed),
        positions[0] if positions else None,
        dropouts[0] if dropouts else None,
        lists[0],
        norms[0],
        head,
        rotary,
        head.weight is embed.weight,
    )
