"""How a run starts its first worker early: the command that loads the plugin without a
look-up of entry points, the header written after the worker started (the worker waits for
it before its first record), and the end of a worker seen at once."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

from gpucheck.controller import harness as harness_mod
from gpucheck.controller.harness import Harness, wait_any
from gpucheck.controller.spawning import PLUGIN_ENTRY_POINT, PLUGIN_MODULE, WorkerSpec
from gpucheck.model import results
from gpucheck.model.runlog import RunLog

ROOT = Path(__file__).resolve().parents[2]


def test_the_worker_blocks_the_plugins_entry_point_by_its_name_in_pyproject():
    """The worker loads the plugin by its module and blocks the entry point by name: a name
    that is not the entry point's would load the plugin twice (pytest refuses that)."""
    points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert points["pytest11"] == {PLUGIN_ENTRY_POINT: PLUGIN_MODULE}


def test_records_wait_for_a_header_written_after_the_worker_started(tmp_path):
    """The controller writes the header once the worker runs (``on_start``); a worker whose
    first record comes at once (a file that cannot be collected) waits for it."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_broken.py").write_text("this is not python\n")
    (suite / "test_ok.py").write_text("def test_ok():\n    pass\n")
    out = tmp_path / "out"
    out.mkdir()
    path = out / "results.jsonl"
    spec = WorkerSpec("cpu", None, None, {"s": suite}, "blocking", env={"CUDA_VISIBLE_DEVICES": ""})
    started: list[float] = []

    def late_header() -> None:
        started.append(time.monotonic())
        time.sleep(2.0)  # longer than the worker takes to its first record
        results.append(path, {"schema": results.SCHEMA_ID, "record": "run", "run_id": "r1"})

    Harness(
        [spec], out, RunLog(path), "r1", timeout=60, on_start=late_header, wait_header=True
    ).run()
    lines = results.read_lines(path)[0]
    assert [r["record"] for r in lines] == ["run", "case", "plan", "case"]
    assert {r.get("case") for r in lines[1:]} == {"test_broken.py", None, "test_ok.py::test_ok"}
    cmd = next((out / "workers").glob("*.cmd")).read_text().split()
    assert "--gpucheck-wait-header" in cmd
    assert cmd[cmd.index(f"no:{PLUGIN_ENTRY_POINT}") + 2] == PLUGIN_MODULE


def _sleeper(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


@pytest.mark.parametrize("pidfd", [True, False])
def test_the_end_of_a_worker_is_seen_at_once(monkeypatch, pidfd):
    if not pidfd:
        monkeypatch.delattr(harness_mod.os, "pidfd_open", raising=False)
    elif not hasattr(harness_mod.os, "pidfd_open"):
        pytest.skip("no pidfd here")
    slow, quick = _sleeper(30), _sleeper(0.3)
    try:
        t0 = time.monotonic()
        wait_any([quick, slow] if not pidfd else [slow, quick], timeout=10)
        assert quick.poll() is not None and slow.poll() is None
        assert time.monotonic() - t0 < 5
        t0 = time.monotonic()
        wait_any([slow], timeout=0.2)  # nothing ends: back after the timeout
        assert 0.15 < time.monotonic() - t0 < 5
    finally:
        slow.kill()
        slow.wait()
