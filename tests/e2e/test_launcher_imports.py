"""The launcher's import cost: what `ppx run` does before any rank starts needs no torch."""

import subprocess
import sys

from helpers import REPO


def test_the_launcher_checks_a_config_without_importing_torch():
    # every `ppx run` claims its run directory before any rank starts; torch costs it ~1.5 s

    code = (
        "import sys; from ppx import config; from ppx.launch import devices, claim, processes, slurm; "
        "cfg = config.load('gpipe_4gpu', ['model.kind=synthetic', 'pipeline.split=layers']); "
        "config.resolve_schedule(cfg); devices.choose_device('cpu', 4); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
