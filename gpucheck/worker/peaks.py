"""A case's memory peaks in the worker: PyTorch's on the target, and NVML's per GPU.

:class:`MemoryWatch` resets the peaks as a case starts and reads them as it ends into the
record's :class:`~gpucheck.model.memory.Memory`: PyTorch's peak allocated and reserved on the
target device (only where this process initialized CUDA: the watch never does), what was
allocated when the case started, and, in NVML modes, this process's peak on the target GPU
and on the others, sampled in the background (:mod:`gpucheck.nvml_sampler`). A peak NVML did
not see (it failed during the case) is unknown, and the case gets a warning saying so.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from gpucheck import nvml
from gpucheck.model.memory import Memory
from gpucheck.model.results import CaseInfo, Finding
from gpucheck.nvml_sampler import CasePeaks, Sampler


def torch_cuda() -> Any:
    """torch.cuda if this process already initialized CUDA, else None (never initializes it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda


class MemoryWatch:
    """The peaks of each case on one worker's target device (``device_index``, its NVML
    ``uuid``), NVML sampled every ``interval`` seconds (0: not sampled)."""

    def __init__(self, device_index: int | None, uuid: str | None, interval: float) -> None:
        self.device_index = device_index
        self.uuid = uuid
        self.peaks: CasePeaks | None = None
        self.sampler: Sampler | None = None
        if interval > 0 and nvml.status().ok:
            self.peaks = CasePeaks()
            self.sampler = Sampler(interval, self.peaks, pid=os.getpid()).start()

    def case_started(self) -> int | None:
        """Reset the peaks for a case; PyTorch's allocated memory on the target now (what
        earlier cases left: the case's own peak is the peak above it), None without CUDA."""
        allocated = None
        cuda = torch_cuda()
        if cuda is not None and self.device_index is not None:
            cuda.reset_peak_memory_stats(self.device_index)  # the target's, whatever is current
            allocated = int(cuda.memory_allocated(self.device_index))
        if self.peaks is not None and self.sampler is not None:
            self.peaks.reset()
            self.peaks(time.time(), self.sampler.sample())
        return allocated

    def case_finished(
        self, info: CaseInfo, allocated_at_start: int | None
    ) -> tuple[Memory, Finding | None]:
        """The case's peaks, and the warning of NVML failing during it (None: it did not)."""
        memory, failed = Memory(), None
        if self.peaks is not None and self.sampler is not None:
            self.peaks(time.time(), self.sampler.sample())  # catch cases shorter than a period
            peaks = self.peaks.snapshot()
            why = self.peaks.error()
            if why:  # a peak NVML did not see is unknown, not 0
                failed = _nvml_failed(why, info)
            else:
                memory.nvml_peak_used = peaks.get(self.uuid or "", 0)
                memory.nvml_peak_other_devices = {
                    u: b for u, b in peaks.items() if u != self.uuid and b
                }
        cuda = torch_cuda()
        if cuda is not None and self.device_index is not None:
            memory.torch_peak_allocated = int(cuda.max_memory_allocated(self.device_index))
            memory.torch_peak_reserved = int(cuda.max_memory_reserved(self.device_index))
            memory.torch_allocated_at_start = allocated_at_start
        return memory, failed


def _nvml_failed(why: str, info: CaseInfo) -> Finding:
    """The warning of a case during which NVML failed (mode nvml): its peaks are unknown."""
    return info.finding(
        "nvml-error",
        "warning",
        f"NVML failed while this case ran ({why}): its NVML memory peak is unknown, and "
        "memory it held on other GPUs (a stray context) could not be seen",
        hint="the case's own result stands; NVML answered before and then failed (a driver "
        "problem: nvidia-smi and the kernel log say more); the run's notes say since when",
    )
