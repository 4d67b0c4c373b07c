"""wrong-stream: an op launched GPU work on a stream other than the caller's current stream.

An extension that launches on stream ``0`` (the legacy default stream) or on a private stream
is not ordered after the caller's work on the current stream (torch's streams are
non-blocking): its kernels may read inputs that are not written yet, and later work on the
current stream may read its outputs too early. The result is usually right by luck, and
always right under ``CUDA_LAUNCH_BLOCKING=1``, so this detector does not look at results: the
harness makes a fresh non-default stream current for every case (the poisoned stream, see
:mod:`gpucheck.runner.poison`), and the profiler reports the stream of every kernel.

The profiler names streams by ids of its own (CUPTI's), not by ``cudaStream_t``. To learn the
id of the current stream, the detector launches one tiny marker kernel on it (a ``fill_``
inside a ``gpucheck::current_stream`` annotation) at the start of the profiled window: the
marker's stream *is* the current stream. Torch's own ops (``aten::*``, collectives) always
launch on the stream that is current when they run, or on streams they order with events, so
a stream they used during the case was current at that time (a test's own ``with
torch.cuda.stream(s)``) and is fine as well. A finding is GPU work (kernel, memcpy, memset) of
any other op on any other stream.

The parsing is pure functions on plain data (lists of dicts, see :func:`plain_events`), so CI
tests it on traces recorded on a GPU (tests/fixtures/profiler/).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpucheck.detectors.base import BaseDetector, CaseInfo
from gpucheck.report.results import Finding

#: the annotation around the marker kernel, launched on the current stream of each device
MARKER = "gpucheck::current_stream"
#: kineto activity types of GPU work that runs on a stream
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
#: kineto activity types of the host-side ops a kernel is linked to
HOST_OPS = ("cpu_op", "user_annotation")
#: ops of torch itself: they launch on the current stream or order their streams with events
TORCH_OPS = ("aten::", "prims::", "c10d::", "nccl:", "record_param_comms")
MAX_FINDINGS = 8
HINT = ("launch on the caller's current stream of the input's device: "
        "`at::cuda::getCurrentCUDAStream()` (or `c10::cuda::getCurrentCUDAStream()`) as the "
        "launch's stream (`kernel<<<grid, block, shmem, stream>>>`, and the stream argument "
        "of cub/thrust/cudaMemcpyAsync); never stream 0 (the legacy default stream) or a "
        "private stream without an event that orders it after the caller's stream")


@dataclass(frozen=True)
class Launch:
    """One piece of GPU work of the profiled window and the op that launched it."""

    name: str  # kernel name, or "Memcpy DtoH (Device -> Pageable)" and the like
    device: int
    stream: int  # the profiler's stream id (CUPTI's), not a cudaStream_t
    op: str | None  # innermost host op active at the launch (None: outside any torch op)
    marker: bool  # the marker launched on the current stream


def is_torch_op(op: str | None) -> bool:
    return op is not None and op.startswith(TORCH_OPS)


def launches(events: list[dict[str, Any]]) -> list[Launch]:
    """The GPU work of a profiled window, each with the op that launched it.

    ``events`` are plain dicts (:func:`plain_events`): ``name``, ``type`` (kineto activity
    type), ``device``, ``stream`` (GPU work), ``thread``, ``start_ns``, ``end_ns``, ``id``
    (correlation id) and ``linked`` (of GPU work: the ``id`` of the innermost host op active
    at the launch, 0 when none). An op without a namespace (an autograd wrapper such as
    ``GeneratedBackwardFor_gpucheck_ssim_forward_default``) is named after the nearest
    enclosing op that has one (``gpucheck::ssim_forward``).
    """
    hosts = [e for e in events if e["type"] in HOST_OPS]
    ops: dict[int, dict[str, Any]] = {}
    for e in hosts:
        if e["id"] and (e["id"] not in ops or "::" in e["name"]):
            ops[e["id"]] = e
    markers = [e for e in hosts if e["name"] == MARKER]

    def inside(outer: dict[str, Any], inner: dict[str, Any]) -> bool:
        return (outer["thread"] == inner["thread"] and outer["start_ns"] <= inner["start_ns"]
                and inner["end_ns"] <= outer["end_ns"])

    def named(op: dict[str, Any]) -> str:
        if "::" in op["name"]:
            return str(op["name"])
        around = [h for h in hosts if "::" in h["name"] and h["name"] != MARKER
                  and inside(h, op)]
        return str(max(around, key=lambda h: h["start_ns"])["name"]) if around else str(
            op["name"])

    found = []
    for e in events:
        if e["type"] not in GPU_WORK:
            continue
        op = ops.get(e["linked"]) if e["linked"] else None
        in_marker = op is not None and any(inside(m, op) for m in markers)
        found.append(Launch(e["name"], int(e["device"]), int(e["stream"]),
                            None if op is None else named(op), in_marker))
    return found


@dataclass(frozen=True)
class WrongStream:
    """GPU work of one (op, kernel) on a stream that was not current."""

    op: str | None
    kernel: str
    device: int
    streams: tuple[int, ...]  # the streams it ran on (profiler ids)
    current: int  # the current stream (profiler id)
    allowed: tuple[int, ...]  # current plus the streams torch's own ops used
    count: int


def wrong_stream(work: Iterable[Launch]) -> list[WrongStream]:
    """GPU work of non-torch ops on streams that were neither current nor used by torch.

    Devices without a marker launch are not judged (their current stream is unknown).
    """
    work = list(work)
    current = {w.device: w.stream for w in work if w.marker}
    allowed: dict[int, set[int]] = {d: {s} for d, s in current.items()}
    for w in work:
        if w.device in allowed and is_torch_op(w.op):
            allowed[w.device].add(w.stream)
    bad: dict[tuple[str | None, str, int], list[int]] = {}
    for w in work:
        if w.marker or is_torch_op(w.op) or w.device not in current:
            continue
        if w.stream not in allowed[w.device]:
            bad.setdefault((w.op, w.name, w.device), []).append(w.stream)
    return [WrongStream(op, kernel, dev, tuple(sorted(set(streams))), current[dev],
                        tuple(sorted(allowed[dev])), len(streams))
            for (op, kernel, dev), streams in bad.items()]


def findings(case: CaseInfo, bad: list[WrongStream],
             streams: dict[int, str] | None = None) -> list[Finding]:
    """One error finding per (op, kernel); ``streams`` names the current stream per device
    (``torch.cuda.Stream`` repr) for the evidence."""
    out = []
    for b in bad[:MAX_FINDINGS]:
        op = b.op or "an op outside any torch op (a pybind function?)"
        named = (streams or {}).get(b.device)
        times = f" ({b.count} launches)" if b.count > 1 else ""
        out.append(Finding(
            kind="wrong-stream", severity="error",
            message=f"{op} launched {b.kernel}{times} on cuda:{b.device} on a stream that was "
                    "not the current stream",
            device=case.device, suite=case.suite, case=case.case, op=b.op, kernel=b.kernel,
            evidence=(f"profiler stream ids on cuda:{b.device}: the kernel ran on "
                      f"{', '.join(map(str, b.streams))}; the current stream is "
                      f"{b.current}{f' ({named})' if named else ''} (marker kernel); streams "
                      f"torch's own ops used in the case: "
                      f"{', '.join(map(str, b.allowed))}"),
            hint=HINT))
    if len(bad) > MAX_FINDINGS:
        out[-1].message += f" (and {len(bad) - MAX_FINDINGS} more kernels)"
    return out


#: host-side CUPTI overhead records: they reuse correlation ids of real ops
OVERHEAD = ("Activity Buffer Request", "Lazy Function Loading", "CUPTI Buffer Flush",
            "CUPTI Instrumentation", "CUPTI Resource", "Runtime Triggered Module Loading",
            "Driver", "Unknown")


def activity_type(e: Any, on_gpu: bool) -> str | None:
    """The kineto activity type of a ``_KinetoEvent`` (``kernel``, ``cpu_op``, ...; None for
    events the detector ignores). torch 2.11 has no ``activity_type()``: derive it."""
    if hasattr(e, "activity_type"):
        return str(e.activity_type())
    if e.is_user_annotation():
        return "gpu_user_annotation" if on_gpu else "user_annotation"
    name = e.name()
    if on_gpu:
        return ("gpu_memcpy" if name.startswith("Memcpy") else
                "gpu_memset" if name.startswith("Memset") else "kernel")
    # host side: ops have no linked correlation; runtime calls link to their op (and carry
    # CUPTI's correlation ids, another number space than the ops')
    if e.linked_correlation_id() != 0 or name in OVERHEAD or (
            name.startswith("cu") and "::" not in name):
        return None
    return "cpu_op"


def plain_events(result: Any, marked: Iterable[int] = ()) -> list[dict[str, Any]]:
    """The events of a kineto result (``_ProfilerResult``) the detector needs, as plain
    dicts: host ops and annotations, and GPU work with device and stream.

    Fast path: when the GPU work of every ``marked`` device (those with a marker launch) ran
    on one stream, that stream is the marker's, the current one, and nothing can be wrong:
    the host events (most of a trace) are then left out, and with them the markers. This
    loop runs once per profiled event: it stays lean (an enum compare per host event).
    """
    from torch.autograd import DeviceType

    cuda = DeviceType.CUDA
    gpu: list[Any] = []
    host: list[Any] = []
    for e in result.events():
        (gpu if e.device_type() == cuda else host).append(e)
    work = [(e, activity_type(e, True)) for e in gpu]
    streams: dict[int, set[int]] = {}
    for e, kind in work:
        if kind in GPU_WORK:
            streams.setdefault(e.device_index(), set()).add(e.device_resource_id())
    marked = list(marked)
    if marked and all(len(streams.get(d, ())) <= 1 for d in marked):
        return []  # nothing to judge (see above)
    rows = []
    for e, kind in work + [(e, activity_type(e, False)) for e in host]:
        if kind not in HOST_OPS and kind not in GPU_WORK:
            continue
        row = {"name": e.name(), "type": kind, "thread": e.start_thread_id(),
               "start_ns": e.start_ns(), "end_ns": e.end_ns(), "id": e.correlation_id(),
               "linked": e.linked_correlation_id()}
        if kind in GPU_WORK:
            row["device"] = e.device_index()
            row["stream"] = e.device_resource_id()
        rows.append(row)
    return rows


def _torch() -> Any:
    """torch when this process has a CUDA context; never creates one."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch


class WrongStreamDetector(BaseDetector):
    """Profiles each case's body (CPU ops + CUDA activity, no shapes or stacks) and reports
    GPU work of an op on a stream other than the current one."""

    name = "wrong-stream"

    def __init__(self) -> None:
        self.active = False
        self.marks: dict[int, Any] = {}  # device -> 1-element tensor the marker fills
        self.streams: dict[int, str] = {}

    def _config(self, torch: Any) -> tuple[Any, set[Any]]:
        from torch._C._profiler import (
            ProfilerActivity,
            ProfilerConfig,
            ProfilerState,
            _ExperimentalConfig,
        )

        config = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False,
                                _ExperimentalConfig())
        return config, {ProfilerActivity.CPU, ProfilerActivity.CUDA}

    def _devices(self, torch: Any, case: CaseInfo) -> list[int]:
        devices = {int(torch.cuda.current_device())}
        if case.device.startswith("cuda:"):
            devices.add(int(case.device.partition(":")[2]))
        return sorted(devices)

    def case_started(self, case: CaseInfo) -> None:
        torch = _torch()
        self.active = False
        self.streams = {}
        if torch is None or torch._C._autograd._profiler_enabled():
            return  # no CUDA context yet, or someone else is profiling
        from torch.autograd.profiler import _disable_profiler, _enable_profiler, _prepare_profiler

        config, activities = self._config(torch)
        try:
            _prepare_profiler(config, activities)
            _enable_profiler(config, activities)
        except Exception:  # e.g. a profiler of another thread: no profiling for this case
            return
        try:
            with torch.autograd.profiler.record_function(MARKER):
                for d in self._devices(torch, case):
                    if d not in self.marks:
                        self.marks[d] = torch.zeros(1, device=torch.device("cuda", d))
                    with torch.cuda.device(d):
                        self.marks[d].fill_(1)  # on the current stream of d
                    self.streams[d] = repr(torch.cuda.current_stream(d))
        except Exception:  # a detector must never take a case down with it
            _disable_profiler()
            return
        self.active = True

    def stop(self, full: bool = False) -> list[dict[str, Any]] | None:
        """Stop profiling; the window's events (:func:`plain_events`, every host event with
        ``full``), None when it did not profile or the context is lost."""
        if not self.active:
            return None
        self.active = False
        torch = sys.modules["torch"]
        from torch.autograd.profiler import _disable_profiler

        try:
            for d in self.streams:  # GPU activity is collected once it has run
                torch.cuda.synchronize(d)
        except Exception:  # a lost context: the case's own record says why
            _disable_profiler()
            return None
        return plain_events(_disable_profiler(), () if full else self.streams)

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        events = self.stop()
        if events is None:
            return []
        return findings(case, wrong_stream(launches(events)), self.streams)
