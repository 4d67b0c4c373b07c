"""Shared helpers for gpucheck's CPU tests."""

from __future__ import annotations

import os
from typing import Any

import pytest

from gpucheck.devices import Device, Inventory

pytest_plugins = ["pytester"]

# The tests start hundreds of Python processes (gpucheck runs, their workers and ranks): with
# $PYTHONDONTWRITEBYTECODE set (as on our CI image) each compiled gpucheck's modules and
# rewrote their asserts (pytest marks the plugin's distribution for that) from source again,
# about a second of CPU a process. Theirs are written to __pycache__ once and read back after.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# The xdist workers and the processes they start run at once: each with torch's default of an
# OpenMP thread per CPU, their pools spin against each other (a CPU reference or gradcheck took
# several times as long beside another test). One thread each, as gpucheck's own share gives
# its workers on a machine of two CPUs (tests/controller/test_passes.py tests that share).
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def _own_lock_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The runs of the tests lock their GPUs and folders (gpucheck.controller.devlock) in a
    folder of this session's (of each xdist worker): not the machine's, where a real run or
    another test worker holds the same fake GPU-0."""
    os.environ.setdefault("GPUCHECK_LOCK_DIR", str(tmp_path_factory.getbasetemp() / "locks"))


def two_gpu_inventory() -> Inventory:
    """What discovery reports on a machine with two H200s."""
    devs = [
        Device(i, i, f"GPU-{i}", "NVIDIA H200", "9.0", None, 1, 1, 0, 0, 0, 0) for i in range(2)
    ]
    return Inventory(devs, None, "580", "13.0", None, "2.11", None, "cuda-driver-uuid")


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> Inventory:
    """Discovery sees two GPUs (the run's workers are not started by such tests)."""
    from gpucheck import devices

    monkeypatch.setattr(devices, "discover", two_gpu_inventory)
    return two_gpu_inventory()


@pytest.fixture
def harness_specs(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """Replaces the harness by one that starts nothing; each pass's WorkerSpecs land here."""
    from gpucheck.controller import pipeline

    passes: list[list[Any]] = []

    class FakeHarness:
        def __init__(self, specs: list[Any], *args: Any, **kwargs: Any) -> None:
            passes.append(list(specs))
            self.notes: list[str] = []

        def run(self) -> None:
            pass

    monkeypatch.setattr(pipeline, "Harness", FakeHarness)
    return passes
