"""benchmarks/cupti_window.py without a GPU: it measures the profiler on one, and says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "cupti_window.py"


def test_without_a_gpu_one_clear_line_and_nothing_written(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "cupti_window: no CUDA device visible (this measures the profiler on a GPU)"
    ]
    assert not (tmp_path / "o").exists()


def test_bad_arguments_are_usage_errors(tmp_path):
    for args in (["--windows", "1", str(tmp_path)], []):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2
        assert "usage:" in done.stderr and "Traceback" not in done.stderr
