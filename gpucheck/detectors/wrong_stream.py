"""wrong-stream: an extension op launched GPU work on a stream other than the caller's current
stream.

An extension that launches on stream ``0`` (the legacy default stream) or on a private stream
is not ordered after the caller's work on the current stream (torch's streams are
non-blocking): its kernels may read inputs that are not written yet, and later work on the
current stream may read its outputs too early. The result is usually right by luck, and
always right under ``CUDA_LAUNCH_BLOCKING=1``, so this detector does not look at results: the
harness makes a fresh non-default stream current for every case (the poisoned stream, see
:mod:`gpucheck.worker.poison`), and the profiler reports the stream of every kernel of every
extension-op call (:mod:`gpucheck.detectors.launch_trace`), compared with the stream that was
current on the op's input device when it was called.

The functions of compiled extension modules (pybind11) are judged the same way, under the
name ``package._C.function`` (:mod:`gpucheck.detectors.ext_watch`), with the Python line
that called them. A kernel that no watched call launched (a caller the watch does not see:
a function reference taken before gpucheck was loaded, ``ctypes``, C++) but that ran on a
stream no caller had current is a case-level finding naming the kernel and the extension
library that defines it (:func:`gpucheck.detectors.launch_windows.unclaimed`).

A private stream that the op orders after the caller's with an event is correct but is
reported too: the profiler's kernel records do not show events. Such an op is rare; the
finding's evidence names the streams, and ``GPUCHECK_DISABLE_DETECTORS=wrong-stream`` turns
the check off (``GPUCHECK_UNWATCHED`` or the ``gpucheck_unwatched`` marker for one module).
"""

from __future__ import annotations

import os

from gpucheck.detectors.base import BaseDetector, CaseInfo, detector_error
from gpucheck.detectors.launch_trace import TRACE
from gpucheck.detectors.launch_windows import (
    MisplacedLaunch,
    Unclaimed,
    Window,
    judge,
    kernel_list,
    unclaimed,
)
from gpucheck.model.kinds import Kind
from gpucheck.model.results import Finding

#: kernels an op's finding lists one by one in its evidence
MAX_KERNELS = 12
HINT = (
    "launch on the caller's current stream of the input's device: "
    "`at::cuda::getCurrentCUDAStream()` (or `c10::cuda::getCurrentCUDAStream()`) as the "
    "launch's stream (`kernel<<<grid, block, shmem, stream>>>`, and the stream argument "
    "of cub/thrust/cudaMemcpyAsync); never stream 0 (the legacy default stream) or a "
    "private stream without an event that orders it after the caller's stream"
)


def misplaced(windows: list[Window], kind: str) -> list[tuple[MisplacedLaunch, Window]]:
    """The misplaced launches of ``kind`` in every window of a case, each with its window."""
    return [(v, w) for w in windows for v in judge(w.launches()) if v.kind == kind]


def findings(case: CaseInfo, bad: list[tuple[MisplacedLaunch, Window]]) -> list[Finding]:
    """One error finding per op (and device): one bug, however many kernels, cub/thrust
    passes and copies it launched on the wrong stream; the evidence lists each kernel."""
    per_op: dict[tuple[str, int], dict[str, tuple[MisplacedLaunch, Window, int]]] = {}
    # the first window's misplaced launch of each kernel, the launches of every window
    for v, w in bad:
        kernels = per_op.setdefault((v.op, v.device), {})
        first, win, n = kernels.get(v.kernel, (v, w, 0))
        kernels[v.kernel] = (first, win, n + v.count)
    out = []
    for (op, device), kernels in per_op.items():
        items = list(kernels.values())
        v, w, _ = items[0]
        launches = sum(n for _, _, n in items)
        named = w.streams.get(device)
        frame = next((x.frame for x, _, _ in items if x.frame), None)
        what = kernel_list([x.kernel for x, _, _ in items])
        times = f" ({launches} launches)" if launches > 1 else ""
        where = f" (called from {frame})" if frame else ""
        lines = [
            f"{x.kernel}: {n} launch(es) on stream {', '.join(map(str, x.ran_on))}"
            for x, _, n in items[:MAX_KERNELS]
        ]
        if len(items) > MAX_KERNELS:
            lines.append(f"... and {len(items) - MAX_KERNELS} more kernels")
        out.append(
            case.finding(
                "wrong-stream",
                "error",
                f"{op} launched {what}{times} on cuda:{device} on a stream that was "
                f"not the caller's current stream{where}",
                op=op,
                kernel=v.kernel,
                evidence=f"profiler stream ids on cuda:{device}: the stream current there when "
                f"{op} was called is {v.expected}{f' ({named})' if named else ''} (a "
                "marker kernel launched on it just before the call); its launches "
                "elsewhere:\n" + "\n".join(lines) + (f"\ncalled from {frame}" if frame else ""),
                hint=HINT,
            )
        )
    return out


def unclaimed_findings(case: CaseInfo, windows: list[Window]) -> list[Finding]:
    """One error finding per library (and device) for the kernels that no watched call
    launched, on a stream no caller had current
    (:func:`~gpucheck.detectors.launch_windows.unclaimed`); the evidence lists each kernel."""
    per_lib: dict[tuple[str | None, int], dict[str, tuple[Unclaimed, int]]] = {}
    for w in windows:
        for u in unclaimed(w):
            kernels = per_lib.setdefault((u.library, u.device), {})
            first, n = kernels.get(u.kernel, (u, 0))
            kernels[u.kernel] = (first, n + u.count)
    out = []
    for (library, device), kernels in per_lib.items():
        items = list(kernels.values())
        u = items[0][0]
        lib = os.path.basename(library) if library else None
        stream0 = " (the legacy default stream)" if all(x.legacy for x, _ in items) else ""
        launches = sum(n for _, n in items)
        what = kernel_list([x.kernel for x, _ in items])
        times = f" ({launches} launches)" if launches > 1 else ""
        streams = sorted({s for x, _ in items for s in x.ran_on})
        lines = [
            f"{x.kernel}: {n} launch(es) on stream {', '.join(map(str, x.ran_on))}"
            for x, n in items[:MAX_KERNELS]
        ]
        if len(items) > MAX_KERNELS:
            lines.append(f"... and {len(items) - MAX_KERNELS} more kernels")
        out.append(
            case.finding(
                "wrong-stream",
                "error",
                f"{what}{times}"
                + (f" of {lib}" if lib else "")
                + f" ran on cuda:{device} on stream {', '.join(map(str, streams))}"
                f"{stream0}, not the caller's current stream, and no watched call "
                "launched it",
                kernel=u.kernel,
                evidence=f"profiler stream ids on cuda:{device}; the watched calls around them "
                f"had {', '.join(map(str, u.current))} current; library: "
                + (
                    library
                    or "not found among the compiled torch extensions of the "
                    "process (the profiler does not name a kernel's library)"
                )
                + "; no watched call's markers enclose the launches (a caller the watch "
                "does not see: a reference taken before gpucheck was loaded, ctypes, "
                "or C++):\n" + "\n".join(lines),
                hint=HINT,
            )
        )
    return out


#: work launched on another stream than the caller's current one (always right under
#: CUDA_LAUNCH_BLOCKING: after what gives wrong values)
WRONG_STREAM = Kind("wrong-stream", precedence=110)


class WrongStream(BaseDetector):
    """Reads the launch trace of each case (see :mod:`gpucheck.detectors.launch_trace`)."""

    name = "wrong-stream"
    kinds = (WRONG_STREAM,)

    def __init__(self) -> None:
        self.trace = TRACE

    def case_started(self, case: CaseInfo) -> None:
        self.trace.acquire()

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        windows = self.trace.finish()
        return (
            findings(case, misplaced(windows, "wrong-stream"))
            + unclaimed_findings(case, windows)
            + [
                detector_error(self.name, what, case, sev)
                for sev, what in self.trace.take_problems()
            ]
        )
