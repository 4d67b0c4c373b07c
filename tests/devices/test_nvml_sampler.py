"""NVML sampling: per-case peaks of this process and the parent's timeline file."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pynvml
import pytest

from gpucheck import nvml
from gpucheck.model.timeline import TimelineWriter
from gpucheck.nvml_sampler import CasePeaks, Sampler


@pytest.fixture
def two_gpus(monkeypatch):
    """NVML with two devices; this process holds `held[i]` bytes on device i."""
    nvml.reset()
    held = {0: 0, 1: 0}
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: f"GPU-{h}")
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetMemoryInfo",
        lambda h, version=None: SimpleNamespace(total=100, free=90, used=10 + held[h], reserved=0),
    )
    monkeypatch.setattr(pynvml, "nvmlSystemGetProcessName", lambda pid: "python")
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetComputeRunningProcesses",
        lambda h: (
            [
                SimpleNamespace(pid=os.getpid(), usedGpuMemory=held[h]),
                SimpleNamespace(pid=1, usedGpuMemory=7),
            ]
            if held[h]
            else [SimpleNamespace(pid=1, usedGpuMemory=7)]
        ),
    )
    yield held
    nvml.reset()


def test_case_peaks_track_this_process_per_device(two_gpus):
    peaks = CasePeaks()
    sampler = Sampler(0.01, peaks, pid=os.getpid())
    two_gpus[0] = 500
    peaks(time.time(), sampler.sample())
    two_gpus[0] = 200
    two_gpus[1] = 64  # a stray context on the other device
    peaks(time.time(), sampler.sample())
    assert peaks.snapshot() == {"GPU-0": 500, "GPU-1": 64}
    peaks.reset()
    assert peaks.snapshot() == {}


def test_sampler_thread_writes_a_timeline(two_gpus, tmp_path):
    two_gpus[1] = 300
    writer = TimelineWriter(tmp_path / "nvml_timeline.jsonl")
    sampler = Sampler(0.01, writer).start()
    time.sleep(0.2)
    sampler.stop()
    writer.close()
    lines = [json.loads(x) for x in (tmp_path / "nvml_timeline.jsonl").read_text().splitlines()]
    assert len(lines) == sampler.samples >= 5
    dev1 = lines[-1]["devices"][1]
    assert dev1["uuid"] == "GPU-1" and dev1["used"] == 310
    assert dev1["processes"] == {str(os.getpid()): 300, "1": 7}


def test_sampler_without_nvml_does_nothing():
    nvml.reset()
    if nvml.status().ok:
        pytest.skip("this machine has NVML")
    sampler = Sampler(0.01, CasePeaks()).start()
    assert not sampler.available
    sampler.stop()
    assert sampler.samples == 0


def test_a_sample_asks_no_process_names(two_gpus, monkeypatch):
    """A sample keeps each process's memory, never its name: it asks NVML one call per device,
    not one more per process (every 50 ms, beside the cases)."""
    asked = []
    monkeypatch.setattr(pynvml, "nvmlSystemGetProcessName", lambda pid: asked.append(pid))
    two_gpus[0] = 500
    rows = Sampler(0.01, CasePeaks()).sample()
    assert rows[0].processes == {str(os.getpid()): 500, "1": 7}
    assert asked == []
    assert [p.name for p in nvml.compute_processes(nvml.handle(0))] == [None, None]  # names asked
    assert len(asked) == 2
