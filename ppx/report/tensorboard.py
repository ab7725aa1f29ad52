"""TensorBoard in ``<run>/tb/``: the scalars every step; at the end the timeline and breakdown
pictures as images and a markdown summary (theory against measured, then the config) as text.
The Scalars, Images and Text tabs work offline. The profiler traces (``profile.enabled``) are
written into the same folder, so TensorBoard shows one run: its PyTorch Profiler plugin finds
them there (one worker per rank); that tab loads Google Charts, so it needs a browser with
internet access.

``log_comparison`` does the same for ``ppx compare``'s folder: its pictures and its table."""

from __future__ import annotations

from pathlib import Path

from ppx.report.split_ways import HEADER, split_rows
from ppx.report.summary_table import setup_words, summary_rows
from ppx.units import count

RUN_IMAGES = ("timeline", "breakdown")
COMPARE_IMAGES = ("compare", "bubble")


def _writer(log_dir: Path):
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(log_dir))


def add_png(writer, tag: str, png: Path, step: int = 0) -> bool:
    """Log a PNG file as a TensorBoard image (RGB, alpha dropped); False when it is missing."""
    if not png.exists():
        return False
    import matplotlib.image

    pixels = matplotlib.image.imread(str(png))  # H x W x 3 or 4, floats in [0, 1]
    if pixels.ndim == 3:
        pixels = pixels[..., :3]
    writer.add_image(tag, pixels, step, dataformats="HWC" if pixels.ndim == 3 else "HW")
    return True


def summary_markdown(summary: dict, config_yaml: str | None = None) -> str:
    """The run's summary as markdown: theory against measured, how each stage split its
    backward (a split-backward run), then the config as YAML."""
    rows = summary_rows(summary)
    v = summary.get("virtual_stages") or 1
    lines = [
        f"**{summary.get('experiment')}**: {summary.get('schedule')}, {summary.get('stages')} stages"
        f"{f' ({v} per rank)' if v > 1 else ''}, m={summary.get('microbatches')}, {summary.get('model')}, "
        f"{summary.get('world_size')} ranks on {summary.get('device')} ({summary.get('backend')}){setup_words(summary)}, "
        f"{count(summary.get('steps') or 0, 'step')} of batch {summary.get('batch_size')}: {summary.get('status')}",
        "",
        "### theory vs measured",
        "",
        "| | measured | predicted (simulator, measured costs) | theory |",
        "| --- | --- | --- | --- |",
        *(f"| {' | '.join(row)} |" for row in rows),
        "",
    ]
    if summary.get("bubble_theory_basis"):
        lines += [f"Theory: {summary['bubble_theory_basis']}.", ""]
    if summary.get("bubble_normalisation"):
        lines += [f"Bubble: {summary['bubble_normalisation']}.", ""]
    split = split_rows(summary)
    if split:
        lines += ["### split backward by stage", "", f"| {' | '.join(HEADER)} |", "|" + " --- |" * len(HEADER)]
        lines += [*(f"| {' | '.join(row)} |" for row in split), ""]
    if config_yaml:
        lines += ["### config", "", "```yaml", config_yaml.rstrip("\n"), "```", ""]
    return "\n".join(lines)


class TensorBoardSink:
    def __init__(self, run_dir: Path):
        self.writer = _writer(run_dir / "tb")

    def step(self, step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def start(self) -> None:
        """The run's steps are over: nothing to start (TensorBoard writes as it goes)."""

    def finish(self, summary: dict, run_dir: Path) -> None:
        last = max(int(summary.get("steps") or 1) - 1, 0)
        for tag in RUN_IMAGES:
            add_png(self.writer, tag, run_dir / f"{tag}.png", last)
        config = run_dir / "config.yaml"
        text = summary_markdown(summary, config.read_text() if config.exists() else None)
        self.writer.add_text("summary", text, last)
        self.writer.close()

    def close(self, wait_s: float | None = None) -> None:
        """Nothing to await: `finish` wrote and closed the files."""


def log_comparison(out_dir: Path) -> Path | None:
    """Log a comparison folder's pictures as images and compare.md as text into ``<out>/tb/``;
    the folder written, or None when there was nothing to log."""
    pngs = [out_dir / f"{tag}.png" for tag in COMPARE_IMAGES]
    table = out_dir / "compare.md"
    if not table.exists() and not any(p.exists() for p in pngs):
        return None
    writer = _writer(out_dir / "tb")
    for tag, png in zip(COMPARE_IMAGES, pngs):
        add_png(writer, tag, png)
    if table.exists():
        writer.add_text("compare", table.read_text())
    writer.close()
    return out_dir / "tb"
