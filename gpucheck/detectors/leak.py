"""leak: memory that a case keeps after it ends, growing with every repetition.

A case marked ``@pytest.mark.gpucheck_repeat(n)`` (``n >= 2``, default 5) runs its body ``n``
times in the worker (fixtures once). After each run the detector synchronizes the target
device, collects Python garbage and measures two things:

* PyTorch's allocated bytes on the target device (``torch.cuda.memory_allocated``): tensors
  kept alive across calls (a cache, a list that grows, a reference cycle held by a global);
* the memory *outside* PyTorch's caching allocator: this process's NVML memory on the target
  device minus ``torch.cuda.memory_reserved``. A raw ``cudaMalloc`` without ``cudaFree`` —
  which the caching allocator never sees — grows it; the CUDA context and lazily loaded
  kernels do not change between runs. Without NVML the driver's used memory of the whole
  device (``cudaMemGetInfo``) stands in.

The first run is the baseline (lazy initialization happens there). A leak is growth from the
first measurement to the last beyond the tolerance (:data:`TORCH_TOL`, :data:`RAW_TOL`)
that is still growing in the second half of the runs (a one-time step is not a leak), or, for
PyTorch's exact count, growth at every run. Unmarked cases cost nothing: the detector only
measures when the worker repeats a case.
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
from collections.abc import Callable
from typing import Any

from gpucheck import nvml
from gpucheck.detectors.base import BaseDetector, CaseInfo, WorkerContext
from gpucheck.model.kinds import Kind
from gpucheck.model.results import Finding

__all__ = ["DEFAULT_REPEATS", "MARKER", "Leak", "judge", "repeats"]

MARKER = "gpucheck_repeat"
DEFAULT_REPEATS = 5
#: PyTorch allocated bytes of growth that count (with growth in the second half)
TORCH_TOL = 1 << 20
#: bytes outside the caching allocator (NVML is coarse: 2 MiB pages)
RAW_TOL = 4 << 20
HINT_TORCH = (
    "tensors outlive the call that made them: a cache or list that grows on every "
    "call, or a reference kept by a global or a closure"
)
HINT_RAW = (
    "memory outside PyTorch's allocator grows on every call: a raw cudaMalloc (or "
    "cudaMallocHost/cuBLAS handle/stream) without its free; take scratch memory from "
    "the caching allocator (at::empty with x.options()) instead"
)


def repeats(item: Any) -> int:
    """How often the case runs (1 when it has no ``gpucheck_repeat`` marker)."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return 1
    n = marker.args[0] if marker.args else marker.kwargs.get("n", DEFAULT_REPEATS)
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"{MARKER}(n) needs an int n >= 2, got {n!r}")
    return n


def _grew(samples: list[int], tol: int, exact: bool) -> bool:
    if len(samples) < 2:
        return False
    total = samples[-1] - samples[0]
    mid = samples[len(samples) // 2]
    steady = all(b > a for a, b in itertools.pairwise(samples))
    return (total > tol and samples[-1] > mid) or (exact and steady and len(samples) >= 3)


def judge(
    torch_alloc: list[int], outside: list[int] | None, case: CaseInfo, outside_how: str
) -> list[Finding]:
    """Findings for one repeated case from its measurements after each run."""
    runs = len(torch_alloc)
    found = []
    if _grew(torch_alloc, TORCH_TOL, exact=True):
        grow = torch_alloc[-1] - torch_alloc[0]
        found.append(
            case.finding(
                "leak",
                "error",
                f"PyTorch memory grows with every run: +{grow / (1 << 20):.2f} MiB "
                f"allocated after {runs} runs ({grow / (runs - 1) / (1 << 20):.2f} MiB per "
                f"run)",
                evidence="torch.cuda.memory_allocated after each run: "
                + ", ".join(map(str, torch_alloc)),
                hint=HINT_TORCH,
            )
        )
    if outside is not None and _grew(outside, RAW_TOL, exact=False):
        grow = outside[-1] - outside[0]
        found.append(
            case.finding(
                "leak",
                "error",
                f"memory outside PyTorch's allocator grows with every run: "
                f"+{grow / (1 << 20):.1f} MiB after {runs} runs "
                f"({grow / (runs - 1) / (1 << 20):.1f} MiB per run): raw cudaMalloc "
                f"without free?",
                evidence=f"{outside_how} after each run: "
                + ", ".join(map(str, outside))
                + "\ntorch.cuda.memory_allocated after each run: "
                + ", ".join(map(str, torch_alloc)),
                hint=HINT_RAW,
            )
        )
    return found


#: memory a repeated case keeps
LEAK = Kind("leak", precedence=120)


class Leak(BaseDetector):
    """Worker side: measures between the repetitions of cases marked ``gpucheck_repeat``."""

    name = "leak"
    kinds = (LEAK,)

    def __init__(self, device_index: int | None = None, uuid: str | None = None) -> None:
        self.device_index = device_index
        self.uuid = uuid
        self._handle: Any = None
        self.torch_alloc: list[int] = []
        self.outside: list[int] = []
        self.outside_how = ""
        self.failure: str | None = None

    def bind(self, worker: WorkerContext) -> None:
        self.device_index, self.uuid = worker.device_index, worker.uuid

    def case_started(self, case: CaseInfo) -> None:
        self.torch_alloc, self.outside, self.failure = [], [], None

    def _nvml_used(self) -> int | None:
        if self.uuid is None or not nvml.status().ok:
            return None
        if self._handle is None:
            for i in range(nvml.device_count()):
                h = nvml.handle(i)
                if h is not nvml.NA and str(nvml.uuid(h)) == self.uuid:
                    self._handle = h
                    break
            else:
                return None
        pid = os.getpid()
        used = [p.used_memory for p in nvml.compute_processes(self._handle) if p.pid == pid]
        return nvml.na_to_none(used[0]) if used else None

    def measure(self) -> None:
        """One measurement after a run (CUDA synchronized, garbage collected)."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized() or self.device_index is None:
            return
        dev = self.device_index
        torch.cuda.synchronize(dev)
        gc.collect()
        self.torch_alloc.append(int(torch.cuda.memory_allocated(dev)))
        reserved = int(torch.cuda.memory_reserved(dev))
        used = self._nvml_used()
        if used is not None:
            self.outside_how = "NVML memory of this process minus torch.cuda.memory_reserved"
        else:
            free, total = torch.cuda.mem_get_info(dev)
            used = int(total - free)
            self.outside_how = "device memory in use (cudaMemGetInfo) minus memory_reserved"
        self.outside.append(int(used) - reserved)

    def repeat(self, body: Callable[[], object], times: int) -> None:
        """After the case's first run: measure, run ``body`` ``times - 1`` more times,
        measuring after each."""
        self.measure()
        for run in range(2, times + 1):
            try:
                body()
            except Exception as err:
                self.failure = f"run {run} of {times} failed: {type(err).__name__}: {err}"
                return
            self.measure()

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        found = judge(
            self.torch_alloc, self.outside if self.outside else None, case, self.outside_how
        )
        if self.failure:
            found.append(
                case.finding(
                    "test-failure",
                    "error",
                    f"the case passed once and failed when repeated: {self.failure}",
                    hint="state left behind by the previous run (a cache, a buffer reused with "
                    "another size, a stream or device left current)",
                )
            )
        return found
