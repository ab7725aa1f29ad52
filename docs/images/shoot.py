"""Remake the README's screenshots: a known-cost 1F1B run on 4 CPU ranks, its report.html and
TensorBoard's Scalars and Images tabs, shot by headless Chromium with the network blocked.

    .venv/bin/python docs/images/shoot.py        # needs chromium (apt-get install chromium)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUN_ARGS = [
    "1f1b_4gpu",
    "train.steps=6",
    "model.kind=synthetic",
    "model.fwd_ms=4",
    "model.bwd_ms=8",
    "model.hidden=16",
    "model.layers=4",
    "logging.wandb.mode=disabled",
]


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="ppx-shots-"))
    ppx = str(Path(sys.executable).with_name("ppx"))
    subprocess.run([ppx, "run", *RUN_ARGS, f"run.root={root}"], check=True)
    (run,) = (root / "1f1b_4gpu").iterdir()
    port = 6199
    tb = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(root), "--port", str(port), "--load_fast=false"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    args = ["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--no-sandbox"]
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=args)
            page = browser.new_page(viewport={"width": 1300, "height": 760})
            page.goto(f"file://{run}/report.html")
            page.wait_for_selector("#timeline .barlayer")
            page.wait_for_timeout(1000)
            page.locator("#timeline").scroll_into_view_if_needed()
            page.screenshot(path=str(HERE / "report.png"), full_page=True, clip=_clip(page, "h1", "#breakdown"))
            time.sleep(8)  # TensorBoard reads the logs in the background
            page.set_viewport_size({"width": 1300, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/#images")
            page.wait_for_timeout(6000)
            page.screenshot(path=str(HERE / "tensorboard-images.png"))
            page.goto(f"http://127.0.0.1:{port}/#scalars&tagFilter=%5E(bubble%7Ctime)%2F")
            page.wait_for_timeout(4000)
            page.get_by_text("Ignore outliers in chart scaling").click()  # few steps: show them all
            smoothing = page.locator("tf-smoothing-input input[type=number], .smoothing input[type=number]").first
            smoothing.fill("0")  # the raw values, not a moving average
            smoothing.press("Enter")
            page.wait_for_timeout(1000)
            page.reload()  # the charts fit their axes to the new settings when drawn afresh
            page.wait_for_timeout(5000)
            page.wait_for_timeout(2000)
            page.screenshot(path=str(HERE / "tensorboard-scalars.png"))
            browser.close()
    finally:
        tb.terminate()
    print(f"ppx: screenshots in {HERE}")


def _clip(page, top_sel: str, bottom_sel: str) -> dict:
    """The page from ``top_sel``'s top to ``bottom_sel``'s top, full width."""
    top = page.locator(top_sel).first.bounding_box()["y"]
    bottom = page.locator(bottom_sel).bounding_box()["y"]
    return {"x": 0, "y": max(top - 10, 0), "width": 1300, "height": bottom - top}


if __name__ == "__main__":
    main()
