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
library that defines it (:func:`gpucheck.detectors.launch_trace.unclaimed`).

A private stream that the op orders after the caller's with an event is correct but is
reported too: the profiler's kernel records do not show events. Such an op is rare; the
finding's evidence names the streams, and ``GPUCHECK_DISABLE_DETECTORS=wrong-stream`` turns
the check off (``GPUCHECK_UNWATCHED`` or the ``gpucheck_unwatched`` marker for one module).
"""

from __future__ import annotations

import os

from gpucheck.detectors.base import BaseDetector, CaseInfo
from gpucheck.detectors.launch_trace import (
    TRACE,
    Unclaimed,
    Verdict,
    Window,
    attribute,
    judge,
    unclaimed,
)
from gpucheck.model.results import Finding

MAX_FINDINGS = 8
HINT = ("launch on the caller's current stream of the input's device: "
        "`at::cuda::getCurrentCUDAStream()` (or `c10::cuda::getCurrentCUDAStream()`) as the "
        "launch's stream (`kernel<<<grid, block, shmem, stream>>>`, and the stream argument "
        "of cub/thrust/cudaMemcpyAsync); never stream 0 (the legacy default stream) or a "
        "private stream without an event that orders it after the caller's stream")


def verdicts(windows: list[Window], kind: str) -> list[tuple[Verdict, Window]]:
    """The verdicts of ``kind`` in every window of a case, each with its window."""
    return [(v, w) for w in windows for v in judge(attribute(w.events, w.log)) if v.kind == kind]


def findings(case: CaseInfo, bad: list[tuple[Verdict, Window]]) -> list[Finding]:
    """One error finding per (op, kernel)."""
    merged: dict[tuple[str, str, int], tuple[Verdict, Window, int]] = {}
    for v, w in bad:  # the first window's verdict, the launches of every window
        first, win, n = merged.get((v.op, v.kernel, v.device), (v, w, 0))
        merged[(v.op, v.kernel, v.device)] = (first, win, n + v.count)
    out = []
    items = list(merged.values())
    for v, w, count in items[:MAX_FINDINGS]:
        named = w.streams.get(v.device)
        times = f" ({count} launches)" if count > 1 else ""
        where = f" (called from {v.frame})" if v.frame else ""
        out.append(Finding(
            kind="wrong-stream", severity="error",
            message=f"{v.op} launched {v.kernel}{times} on cuda:{v.device} on a stream that was "
                    f"not the caller's current stream{where}",
            device=case.device, suite=case.suite, case=case.case, op=v.op, kernel=v.kernel,
            evidence=(f"profiler stream ids on cuda:{v.device}: the kernel ran on "
                      f"{', '.join(map(str, v.ran_on))}; the stream current there when "
                      f"{v.op} was called is {v.expected}"
                      f"{f' ({named})' if named else ''} (a marker kernel launched on it "
                      "just before the call)" + (f"; called from {v.frame}" if v.frame else "")),
            hint=HINT))
    if len(items) > MAX_FINDINGS:
        out[-1].message += f" (and {len(items) - MAX_FINDINGS} more kernels)"
    return out


def unclaimed_findings(case: CaseInfo, windows: list[Window]) -> list[Finding]:
    """One error finding per (kernel, device) that no watched call launched, on a stream no
    caller had current (:func:`~gpucheck.detectors.launch_trace.unclaimed`)."""
    merged: dict[tuple[str, int], Unclaimed] = {}
    counts: dict[tuple[str, int], int] = {}
    for w in windows:
        for u in unclaimed(w):
            merged.setdefault((u.kernel, u.device), u)
            counts[(u.kernel, u.device)] = counts.get((u.kernel, u.device), 0) + u.count
    out = []
    for key, u in list(merged.items())[:MAX_FINDINGS]:
        lib = os.path.basename(u.library) if u.library else None
        stream0 = " (the legacy default stream)" if u.legacy else ""
        times = f" ({counts[key]} launches)" if counts[key] > 1 else ""
        out.append(Finding(
            kind="wrong-stream", severity="error",
            message=f"{u.kernel}{times}" + (f" of {lib}" if lib else "") +
                    f" ran on cuda:{u.device} on stream {', '.join(map(str, u.ran_on))}"
                    f"{stream0}, not the caller's current stream, and no watched call "
                    "launched it",
            device=case.device, suite=case.suite, case=case.case, kernel=u.kernel,
            evidence=(f"profiler stream ids on cuda:{u.device}: the kernel ran on "
                      f"{', '.join(map(str, u.ran_on))}{stream0}; the watched calls around it "
                      f"had {', '.join(map(str, u.current))} current; library: "
                      + (u.library or "not found among the compiled torch extensions of the "
                                      "process (the profiler does not name a kernel's library)")
                      + "; no watched call's markers enclose the launch (a caller the watch "
                        "does not see: a reference taken before gpucheck was loaded, ctypes, "
                        "or C++)"),
            hint=HINT))
    return out


class WrongStream(BaseDetector):
    """Reads the launch trace of each case (see :mod:`gpucheck.detectors.launch_trace`)."""

    name = "wrong-stream"

    def __init__(self) -> None:
        self.trace = TRACE

    def case_started(self, case: CaseInfo) -> None:
        self.trace.acquire()

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        windows = self.trace.finish()
        return (findings(case, verdicts(windows, "wrong-stream"))
                + unclaimed_findings(case, windows))
