"""The memory model's weights: what a rank's parameters hold through a step besides the
activations (no torch: `ppx gpu-check` answers without it where there is no GPU)."""

from __future__ import annotations

STATE_PER_WEIGHT = {"sgd": 0, "adamw": 2}  # optimizer tensors per weight (SGD without momentum keeps none)


def weights_held_bytes(param_bytes: float, optimizer: str) -> float:
    """What a rank's ``param_bytes`` of parameters hold through a step: the fp32 weights, their
    gradients and ``train.optimizer``'s state (SGD none, AdamW two tensors a weight). A bf16
    step's one compute-dtype copy of the weights is left out."""
    return param_bytes * (2 + STATE_PER_WEIGHT[optimizer])
