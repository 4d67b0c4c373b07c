"""What a case leaves in the process's CUDA state for whatever runs next.

device-state-leak: a case (an op inside it) changed the caller's current CUDA device.

The published fix of the KNN wrong-device crash called ``cudaSetDevice(points.device())``:
the crash goes away, every test passes, and the caller's next ``torch.empty(...,
device="cuda")`` silently lands on another GPU. An extension must use a scoped guard, which
restores the device on return. This detector compares the current device just before and
just after the body of each case (the harness has made *another* device current by then).

pending-error: a CUDA call in the case failed and nothing read its error. The runtime keeps
it as the thread's last error until someone reads it (``cudaGetLastError``), and torch reads
it at its next launch: the *next* test fails in its setup with an error that is not its own
(an extension whose check throws on a call's return value without reading the error leaves
it; a launch nobody checked leaves it too, and that kernel never ran). A probe launch after
the body reads it, so the next case starts clean, and the case that left it gets the finding.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from gpucheck.detectors.base import BaseDetector, CaseInfo
from gpucheck.errors import CUDA_ERROR_MARKERS, sticky_cuda_error_line
from gpucheck.model.kinds import Kind
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


#: a case that leaves another device current than it found
DEVICE_STATE_LEAK = Kind("device-state-leak", precedence=40)


class DeviceStateLeak(BaseDetector):
    """Warns when the current device after a case's body differs from before it."""

    name = "device-state-leak"
    kinds = (DEVICE_STATE_LEAK,)

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
            case.finding(
                self.name,
                "warning",
                f"the current CUDA device changed from cuda:{before} to cuda:{after} "
                "during the case and was not restored",
                evidence=f"torch.cuda.current_device() before the case body: {before}, "
                f"after it: {after} (target {case.device})",
                hint=HINT,
            )
        ]


PENDING_HINT = (
    "read the error where the call fails: `C10_CUDA_CHECK(call)` and, after a launch, "
    "`C10_CUDA_KERNEL_LAUNCH_CHECK()` (both read and clear it); a check of its own that "
    "throws on a call's return value must call `cudaGetLastError()` first, or the error "
    "stays pending for the process's next CUDA call"
)


def read_pending(cuda: Any, device: int) -> str | None:
    """The CUDA error pending in this thread's runtime, read (and so cleared) by a launch on
    ``device``, or None. torch raises the runtime's last error at a launch."""
    try:
        with cuda.device(device):
            cuda._sleep(0)
    except Exception as err:  # torch.AcceleratorError (a RuntimeError) and its kin
        return str(err)
    return None


class PendingError(BaseDetector):
    """An error finding when a CUDA error is still pending after a case's body (not after a
    lost context: that error stays, and the case's own record says so). Runs after the launch
    trace's windows are closed: its probe launch is not the case's."""

    name = "pending-error"

    def __init__(self) -> None:
        self.device: int | None = None

    def case_started(self, case: CaseInfo) -> None:
        cuda = _cuda()  # the probe goes to the device current before the body: it has a context
        self.device = None if cuda is None else int(cuda.current_device())

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        device, self.device = self.device, None
        cuda = _cuda()
        if device is None or cuda is None:
            return []
        text = read_pending(cuda, device)
        if text is None or not any(m in text for m in CUDA_ERROR_MARKERS):
            return []  # nothing pending, or a probe that could not launch (no CUDA error)
        if sticky_cuda_error_line(text) is not None:
            return []  # a lost context: the case's own record reports it
        line = text.strip().splitlines()[0]
        code = re.search(r"cudaError\w+", text)
        return [
            case.finding(
                "cuda-error",
                "error",
                f"the case left a CUDA error pending ({line}"
                f"{f', {code.group(0)}' if code else ''}): a CUDA call in it failed and "
                "nothing read the error, so the process's next CUDA launch fails with it "
                "(gpucheck read it: the next case starts clean)",
                evidence=f"read by a launch on cuda:{device} after the case body (torch "
                f"raises the runtime's last error at a launch): {line}",
                hint=PENDING_HINT,
            )
        ]
