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


def test_the_table_names_each_recorder_and_setting():
    import importlib.util

    spec = importlib.util.spec_from_file_location("cupti_window", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert {(r, t) for _, r, t in module.SETTINGS} == {
        ("kineto", None),
        ("kineto", "0"),
        ("kineto", "1"),
        ("callbacks", None),
    }
    row = {
        "window_ms": dict.fromkeys(module.PHASES, 1.0),
        "recorded_per_window": {"first": 3, "min_after_first": 0},
        "launch_us": {"before": 14.0, "after": 20.3},
        "work_ms": {"before": 167.25, "after": 169.37},
    }
    text = module.table(
        {
            "device": "NVIDIA H200",
            "torch": "2.11.0",
            "windows": 50,
            "settings": [
                {"cuda_launch_blocking": "1", "recorder": "kineto", "teardown_cupti": "1", **row},
                {
                    "cuda_launch_blocking": "1",
                    "recorder": "callbacks",
                    "teardown_cupti": None,
                    **row,
                },
            ],
        }
    )
    lines = text.splitlines()
    assert lines[:2] == ["", "NVIDIA H200, torch 2.11.0, 50 windows a setting"]
    assert "| 1 | kineto, TEARDOWN_CUPTI 1 | 1.00 (1.00 / 1.00 / 1.00 / 1.00) | 3 / 0 |" in text
    assert "| 1 | callbacks |" in text and "14.00 -> 20.30" in text
