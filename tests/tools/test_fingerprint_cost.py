"""benchmarks/fingerprint_cost.py on the host: a row per tensor set of the bundled ops, timed
(its GPU work is counted on a GPU only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "fingerprint_cost.py"
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def run(*args: str, env: dict[str, str] = ENV) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_each_set_is_timed_and_written(tmp_path):
    out = tmp_path / "f.json"
    done = run("--reps", "3", "--n", "200", "--side", "32", "--json", str(out))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["machine"]["n"] == 200 and data["machine"]["reps"] == 3
    rows = {r["set"]: r for r in data["rows"]}
    assert rows["splat_project in (8 tensors)"]["tensors"] == 8
    assert rows["splat_project out (10 tensors)"]["tensors"] == 8  # two [0] placeholders
    assert all(r["us"] > 0 and r["us_per_tensor"] > 0 for r in rows.values())
    assert all(r["gpu_work"] == "-" for r in rows.values())  # kineto's count: on a GPU only
    assert done.stdout.count("\n| ") == len(rows) + 1  # the header and a line a set
    assert Path(data["machine"]["numerics"]) == ROOT / "gpucheck" / "detectors" / "numerics.py"


def test_another_checkout_on_the_path_is_the_one_timed(tmp_path):
    """The step's BASE=DIR: another checkout's gpucheck first on PYTHONPATH is the one the
    script times (before an installed or editable gpucheck), and the JSON names it."""
    shutil.copytree(
        ROOT / "gpucheck",
        tmp_path / "base" / "gpucheck",
        ignore=shutil.ignore_patterns("*.so", "__pycache__"),
    )
    out = tmp_path / "f.json"
    env = {**ENV, "PYTHONPATH": str(tmp_path / "base")}
    done = run("--reps", "1", "--n", "50", "--side", "16", "--json", str(out), env=env)
    assert done.returncode == 0, done.stderr
    numerics = tmp_path / "base" / "gpucheck" / "detectors" / "numerics.py"
    assert Path(json.loads(out.read_text())["machine"]["numerics"]) == numerics
    assert str(numerics) in done.stdout


def test_no_gpu_and_bad_arguments_are_clear():
    done = run("--device", "cuda")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "fingerprint_cost: no CUDA device visible (--device cpu measures the host)"
    )
    for args in (["--reps", "0"], ["--n", "x"], ["--device", "tpu"]):
        done = run(*args)
        assert done.returncode == 2 and "usage:" in done.stderr and "Traceback" not in done.stderr
