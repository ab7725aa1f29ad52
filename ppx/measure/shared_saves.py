"""Saved tensors two stages of one rank hold between them, for `MemoryTracker`.

At a V's turn a rank runs two stages one after the other, and the first hands its output to
the second in place. Where the first stage's last op saves that output (a ReLU or Tanh keeps
its result) and the second's first op saves its input (a Linear keeps it for its weight
gradient), one storage is saved by both: the rank holds it once. The memory model counts each
stage's saved bytes apart, so it needs, per stage, those bytes and when the first of the two
holders lets them go (`ppx.schedules.sim.memory.peak_held`'s ``shared``):

- ``"its I"``: the stage's own I (it dropped its graph there and kept no store of them);
- ``"the I before"``: the stage before's I (which dropped its graph), or the stage's W if first;
- ``"a W"``: the first W (or B) of the two (both keep them past their I).
"""

from __future__ import annotations

from ppx.schedules.sim.memory import UNTIL


class SharedSaves:
    """Per stage: the fewest bytes a microbatch's forward saved that the stage before on the
    rank saves too (a microbatch that shared none gives 0: a stage's first forward under
    ``train.split_backward=graph`` runs on a copy of its input, `StageRunner._call`, and the
    walk must not take off bytes the rank held twice), and when the first of the two let them go."""

    def __init__(self) -> None:
        self.bytes: dict[int, int] = {}
        self._keys: dict[tuple[int, int], set] = {}  # (stage, mb) -> the storages shared with the stage before
        self._own_at_input: dict[int, bool] = {}  # stage -> its I let them go
        self._before_at_input: dict[int, bool] = {}  # stage -> the stage before's I let them go

    def forward(self, stage: int, mb: int, seen: dict, held: dict) -> None:
        """Stage ``stage``'s forward of ``mb`` saved ``seen`` (key -> bytes); ``held``: every
        (stage, mb)'s keys on the rank, the stage before's among them."""
        before = set(held.get((stage - 1, mb), ()))
        if not before:  # (the stage before is not on this rank, or holds nothing of it)
            return
        keys = {k for k in seen if k in before}
        if keys:
            self._keys[(stage, mb)] = keys
        shared = sum(seen[k] for k in keys)
        self.bytes[stage] = min(self.bytes.get(stage, shared), shared)

    def input_done(self, stage: int, mb: int, held: dict) -> None:
        """Stage ``stage``'s I of ``mb`` has run; ``held`` as it is now."""
        own, after = self._keys.get((stage, mb)), self._keys.get((stage + 1, mb))
        if not (own or after):  # (every I of a stage that shares nothing: no set made)
            return
        now = set(held.get((stage, mb), ()))
        if own:
            self._own_at_input[stage] = self._own_at_input.get(stage, False) or not own & now
        if after:
            self._before_at_input[stage + 1] = self._before_at_input.get(stage + 1, False) or not after & now

    def record(self) -> dict:
        """{"shared_with_stage_before": {"<stage>": {"bytes": b, "until": one of `UNTIL`}}}, a
        stage whose stage before is on the rank with 0 bytes too (a later step must not lift
        it), or {} where there is none."""
        out = {}
        for stage, b in sorted(self.bytes.items()):
            until = 0 if self._own_at_input.get(stage) else 1 if self._before_at_input.get(stage) else 2
            out[str(stage)] = {"bytes": b, "until": UNTIL[until]}
        return {"shared_with_stage_before": out} if out else {}
