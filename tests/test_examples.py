"""The example scripts run as written (on the CPU, on synthetic data, briefly)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script, args, expect", [
    ("captured_minibatch_gat.py", ["--synthetic", "--epochs", "1"], "accuracy"),
    ("minibatch_rgcn.py", ["--synthetic", "--epochs", "1"], "accuracy"),
    ("link_prediction.py", ["--synthetic", "--epochs", "5", "--hidden", "16"], "test mrr"),
])
def test_example_runs(script, args, expect):
    # as a user runs it: not under the tests' Triton interpreter
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert expect in done.stdout.lower(), done.stdout
