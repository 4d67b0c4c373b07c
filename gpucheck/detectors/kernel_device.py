"""kernel-device: an extension op launched a kernel on another GPU than its inputs'.

A missing device guard makes an op launch on whatever device is current. Without peer access
that kernel faults (an illegal address, which the differential re-run of
:mod:`gpucheck.detectors.wrong_device` diagnoses); with peer access enabled, as multi-GPU
training often has it, the kernel reads the other GPU's memory over NVLink: the result is
right, only slow, and no test fails. The profiler's device of every kernel of every
extension-op call (:mod:`gpucheck.detectors.launch_trace`; the functions of compiled
extension modules too, :mod:`gpucheck.detectors.ext_watch`) shows it either way: a kernel of
a call whose tensors all live on cuda:N that ran on cuda:M is a ``wrong-device`` finding,
with the Python line of the call.
"""

from __future__ import annotations

from gpucheck.detectors.base import BaseDetector, CaseInfo
from gpucheck.detectors.launch_trace import TRACE
from gpucheck.detectors.wrong_device import HINT
from gpucheck.detectors.wrong_stream import verdicts
from gpucheck.model.results import Finding

MAX_FINDINGS = 8


class KernelDevice(BaseDetector):
    """Reads the launch trace of each case; one finding per (op, kernel)."""

    name = "kernel-device"

    def __init__(self) -> None:
        self.trace = TRACE

    def case_started(self, case: CaseInfo) -> None:
        self.trace.acquire()

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        merged: dict[tuple[str, str], tuple[int, set[int], int, str | None]] = {}
        for v, _ in verdicts(self.trace.finish(), "kernel-device"):
            dev, ran, n, frame = merged.get((v.op, v.kernel), (v.device, set(), 0, v.frame))
            merged[(v.op, v.kernel)] = (dev, ran | set(v.ran_on), n + v.count, frame)
        out = []
        for (op, kernel), (dev, ran, n, frame) in list(merged.items())[:MAX_FINDINGS]:
            times = f" ({n} launches)" if n > 1 else ""
            on = ", ".join(f"cuda:{d}" for d in sorted(ran))
            where = f"; called from {frame}" if frame else ""
            out.append(Finding(
                kind="wrong-device", severity="error",
                message=f"{op} launched {kernel}{times} on {on}, but all its tensor arguments "
                        f"are on cuda:{dev} (missing device guard: the kernel ran on the "
                        f"current device{where})",
                device=case.device, suite=case.suite, case=case.case, op=op, kernel=kernel,
                evidence=(f"profiler: {kernel} of {op} ran on {on}; its inputs are on "
                          f"cuda:{dev} (with peer access enabled such a kernel reads the other "
                          "GPU's memory silently and slowly; without it, it faults)"),
                hint=HINT.format(where=f"the C++ function behind `{op}`")))
        return out
