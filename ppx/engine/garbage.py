"""Python's garbage collector kept out of the timed steps.

Left automatic, a full collection starts inside whichever step crosses its allocation
threshold and pauses that rank for as long as it walks the heap (on the 2-core CPU machine,
about 140 ms in the 12th step of a 16-step, 4-stage-per-rank run, half of that step), so every
later rank waits and the step, its bubble and the costs measured from it are wrong. Here
automatic collection is off for the run, what the model's construction left is frozen out
of later collections, and `StepCollector.between_steps` collects between steps, outside the
timed region. ``runtime.gc_steps=0`` leaves Python's automatic collection as it is.
"""

from __future__ import annotations

import gc


class StepCollector:
    """``with StepCollector(every):`` runs the training loop; ``between_steps(step)`` after
    each step collects every ``every`` steps (0: automatic collection, untouched)."""

    def __init__(self, every: int):
        self.every = every
        self._was_enabled = gc.isenabled()

    def __enter__(self) -> StepCollector:
        if self.every > 0:
            gc.collect()
            gc.freeze()  # the model, the program and the imports: never garbage, no longer walked
            gc.disable()
        return self

    def between_steps(self, step: int) -> None:
        if self.every > 0 and (step + 1) % self.every == 0:
            gc.collect()

    def __exit__(self, *exc) -> None:
        if self.every > 0:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()
