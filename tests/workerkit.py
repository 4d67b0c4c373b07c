"""One harness worker run in this process by the controller's own ``Harness``: a suite folder
on the CPU, into a fresh run folder whose header is written first."""

from __future__ import annotations

from pathlib import Path

from gpucheck.controller.harness import Harness
from gpucheck.controller.spawning import WorkerSpec
from gpucheck.model import results
from gpucheck.model.runlog import RunLog


def run_cpu_worker(suite: Path, out: Path) -> tuple[list[dict], Harness]:
    """Run ``suite`` in one CPU worker into ``out`` (made here); its records and the harness
    (its worker's process, command and files)."""
    out.mkdir()
    path = out / "results.jsonl"
    results.append(path, {"schema": results.SCHEMA_ID, "record": "run", "run_id": "r1"})
    spec = WorkerSpec("cpu", None, None, {"s": suite}, "blocking", env={"CUDA_VISIBLE_DEVICES": ""})
    harness = Harness([spec], out, RunLog(path), "r1", timeout=60)
    harness.run()
    return results.read_lines(path)[0], harness
