"""device-state-leak: a case (an op inside it) changed the caller's current CUDA device.

The published fix of the KNN wrong-device crash called ``cudaSetDevice(points.device())``:
the crash goes away, every test passes, and the caller's next ``torch.empty(...,
device="cuda")`` silently lands on another GPU. An extension must use a scoped guard, which
restores the device on return. This detector compares the current device just before and
just after the body of each case (the harness has made *another* device current by then).
"""

from __future__ import annotations

import sys
from typing import Any

from gpucheck.detectors.base import BaseDetector, CaseInfo
from gpucheck.model.results import Finding

HINT = (
    "use a scoped guard, which restores the caller's device on return: "
    "`const at::cuda::OptionalCUDAGuard guard(device_of(x));` in C++ "
    "(or `with torch.cuda.device(x.device):` in Python), not a bare `cudaSetDevice`"
)


def _cuda() -> Any:
    """torch.cuda when this process has initialized CUDA; never initializes it."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda


class DeviceStateLeak(BaseDetector):
    """Warns when the current device after a case's body differs from before it."""

    name = "device-state-leak"

    def __init__(self) -> None:
        self.before: int | None = None

    def case_started(self, case: CaseInfo) -> None:
        cuda = _cuda()
        self.before = None if cuda is None else int(cuda.current_device())

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        before, self.before = self.before, None
        cuda = _cuda()
        if before is None or cuda is None:
            return []
        after = int(cuda.current_device())
        if after == before:
            return []
        return [
            Finding(
                kind=self.name,
                severity="warning",
                message=f"the current CUDA device changed from cuda:{before} to cuda:{after} "
                "during the case and was not restored",
                device=case.device,
                suite=case.suite,
                case=case.case,
                evidence=f"torch.cuda.current_device() before the case body: {before}, "
                f"after it: {after} (target {case.device})",
                hint=HINT,
            )
        ]
