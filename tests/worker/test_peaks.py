"""A case's memory peaks in the worker (gpucheck.worker.peaks): PyTorch's on the target and
this process's NVML peak per GPU, read into the record's ``memory``; a peak NVML did not see is
unknown, with a warning, never 0."""

from __future__ import annotations

import os

import pytest

from gpucheck.model.memory import Memory
from gpucheck.model.results import CaseInfo
from gpucheck.model.timeline import DeviceRow
from gpucheck.nvml_sampler import CasePeaks
from gpucheck.worker import peaks
from gpucheck.worker.peaks import MemoryWatch

INFO = CaseInfo("cuda:1", "s", "t.py::t")
ME = str(os.getpid())


class FakeCuda:
    """torch.cuda as a worker that initialized CUDA sees it (this machine has no GPU)."""

    def __init__(self) -> None:
        self.allocated, self.peak, self.reserved, self.reset = 40, 40, 64, []

    def reset_peak_memory_stats(self, device: int) -> None:
        self.reset.append(device)

    def memory_allocated(self, device: int) -> int:
        return self.allocated

    def max_memory_allocated(self, device: int) -> int:
        return self.peak

    def max_memory_reserved(self, device: int) -> int:
        return self.reserved


class Samples:
    """NVML's answers, one list of rows per sample."""

    def __init__(self, *samples: list[DeviceRow]) -> None:
        self.samples = list(samples)

    def sample(self) -> list[DeviceRow]:
        return self.samples.pop(0)


def row(uuid: str, used: int | None, error: str | None = None) -> DeviceRow:
    return DeviceRow(0, uuid, used, None if error else {ME: used}, error)


def test_without_cuda_or_nvml_nothing_is_measured() -> None:
    watch = MemoryWatch(None, None, 0.0)
    assert watch.case_started() is None
    assert watch.case_finished(INFO, None) == (Memory(), None)  # written as {}: unknown


def test_pytorchs_peaks_are_the_targets_and_the_start_is_kept(monkeypatch) -> None:
    cuda = FakeCuda()
    monkeypatch.setattr(peaks, "torch_cuda", lambda: cuda)
    watch = MemoryWatch(1, "GPU-1", 0.0)
    at_start = watch.case_started()
    assert at_start == 40 and cuda.reset == [1]  # the target's, whatever device is current
    cuda.peak = 300
    memory, failed = watch.case_finished(INFO, at_start)
    assert failed is None
    assert memory == Memory(
        torch_peak_allocated=300, torch_peak_reserved=64, torch_allocated_at_start=40
    )
    assert memory.own_peak == 260


def test_nvml_peaks_per_gpu_and_a_failure_is_unknown_with_a_warning() -> None:
    watch = MemoryWatch(None, "GPU-1", 0.0)
    watch.peaks = CasePeaks()
    watch.sampler = Samples(  # type: ignore[assignment]
        [row("GPU-1", 100), row("GPU-2", 0)],
        [row("GPU-1", 700), row("GPU-2", 50)],
    )
    watch.case_started()
    memory, failed = watch.case_finished(INFO, None)
    assert failed is None
    assert (memory.nvml_peak_used, memory.nvml_peak_other_devices) == (700, {"GPU-2": 50})
    watch.sampler = Samples(  # type: ignore[assignment]
        [row("GPU-1", 100)], [row("GPU-1", None, "NVMLError_Unknown: Unknown Error")]
    )
    watch.case_started()
    memory, failed = watch.case_finished(INFO, None)
    assert memory == Memory()  # not 0
    assert failed is not None and (failed.kind, failed.severity) == ("nvml-error", "warning")
    assert "NVMLError_Unknown" in failed.message and failed.case == INFO.case


@pytest.mark.parametrize("index", [None, 0])
def test_torch_never_initializes_cuda_for_the_watch(index: int | None) -> None:
    assert peaks.torch_cuda() is None  # no CUDA in this process
    assert MemoryWatch(index, None, 0.0).case_finished(INFO, 5) == (Memory(), None)
