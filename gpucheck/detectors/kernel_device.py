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

from gpucheck.detectors.base import BaseDetector, CaseInfo, detector_error
from gpucheck.detectors.launch_trace import TRACE
from gpucheck.detectors.launch_windows import kernel_list
from gpucheck.detectors.wrong_device import HINT
from gpucheck.detectors.wrong_stream import misplaced
from gpucheck.model.results import Finding


class KernelDevice(BaseDetector):
    """Reads the launch trace of each case; one finding per op."""

    name = "kernel-device"

    def __init__(self) -> None:
        self.trace = TRACE

    def case_started(self, case: CaseInfo) -> None:
        self.trace.acquire()

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        per_op: dict[str, tuple[int, dict[str, int], set[int], str | None]] = {}
        for v, _ in misplaced(self.trace.finish(), "kernel-device"):
            dev, kernels, ran, frame = per_op.get(v.op, (v.device, {}, set(), v.frame))
            kernels[v.kernel] = kernels.get(v.kernel, 0) + v.count
            per_op[v.op] = (dev, kernels, ran | set(v.ran_on), frame or v.frame)
        out = []
        for op, (dev, kernels, ran, frame) in per_op.items():  # one finding per op
            n = sum(kernels.values())
            names = list(kernels)
            what = kernel_list(names)
            times = f" ({n} launches)" if n > 1 else ""
            on = ", ".join(f"cuda:{d}" for d in sorted(ran))
            where = f"; called from {frame}" if frame else ""
            out.append(
                case.finding(
                    "wrong-device",
                    "error",
                    f"{op} launched {what}{times} on {on}, but all its tensor arguments "
                    f"are on cuda:{dev} (missing device guard: the kernel ran on the "
                    f"current device{where})",
                    op=op,
                    kernel=names[0],
                    evidence=f"profiler: kernels of {op} ran on {on}; its inputs are on "
                    f"cuda:{dev} (with peer access enabled such a kernel reads the other "
                    "GPU's memory silently and slowly; without it, it faults):\n"
                    + "\n".join(f"{k}: {c} launch(es)" for k, c in list(kernels.items())[:12]),
                    hint=HINT.format(where=f"the C++ function behind `{op}`"),
                )
            )
        problems = self.trace.take_problems()
        return out + [detector_error(self.name, what, case, sev) for sev, what in problems]
