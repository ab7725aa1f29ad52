"""TensorBoard scalars in ``<run>/tb/``. The profiler traces in ``<run>/traces/`` sit beside
them, where TensorBoard's PyTorch Profiler plugin finds them (one worker per rank)."""

from __future__ import annotations

from pathlib import Path


class TensorBoardSink:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))

    def step(self, step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def finish(self, summary: dict, run_dir: Path) -> None:
        self.writer.add_text("summary", "\n".join(f"    {k}: {v}" for k, v in summary.items() if k != "losses"))
        self.writer.close()
