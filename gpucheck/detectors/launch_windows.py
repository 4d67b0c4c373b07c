"""What one window of the launch trace saw, as plain data, and the judgement on it.

A window (:class:`Window`) is the GPU work recorded while it was open (kernels, copies,
memsets with device, stream and a correlation id in launch order) and the log of its markers
(:mod:`gpucheck.detectors.launch_trace`, which records it). The GPU work whose id lies
between a call's two markers was launched during that call (:func:`attribute`, the innermost
call for nested ones: :func:`innermost`); :func:`judge` says which of an op's kernels ran on
another device than its inputs' (``kernel-device``) or on another stream than the caller's
current one (``wrong-stream``); :func:`unclaimed` which kernels no watched call launched, on a
stream no caller had current. Pure functions on plain data, so CI tests them on windows
recorded on a GPU (tests/fixtures/launches/).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gpucheck.detectors import ext_watch
from gpucheck.detectors.elf import name_path

#: the marker kernel (``at::cuda::sleep`` launches ``spin_kernel``)
MARKER_KERNEL = "spin_kernel"
#: kernels of torch (the outermost namespace of their qualified name) and of the vendor
#: libraries it calls (a part of the qualified name, lower case): never judged as unclaimed
TORCH_NAMESPACES = ("at", "at_cuda_detail", "c10", "torch", "caffe2", "pytorch_flash")
TORCH_KERNELS = (
    "cublas",
    "cudnn",
    "nccl",
    "cufft",
    "cusparse",
    "cusolver",
    "curand",
    "cutlass",
    "xmma",
    "gemm",
    "gemv",
    "nvjet",
    "triton",
    "fmha",
    "flash_",
    "magma",
    "cunn_",
    "softmax_warp",
)
#: the op of a window's span of gpucheck's own work (an aside): none of its launches is judged
ASIDE = "<gpucheck>"
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass(frozen=True)
class Work:
    """One piece of GPU work of a window."""

    name: str
    device: int
    stream: int  # the profiler's stream id (CUPTI's)
    correlation: int


@dataclass(frozen=True)
class OpLaunch:
    """GPU work launched during one extension-op call, with what the call expected."""

    op: str
    call: int  # index of the call in the window's log
    work: Work
    device: int  # the op's input device (where its marker ran)
    stream: int  # the current stream of that device at the call (its marker's stream)
    single_device: bool  # all tensor arguments on that one device
    frame: str | None = None  # the Python line of the call


def work_kind(name: str) -> str:
    """``kernel``, ``gpu_memcpy`` or ``gpu_memset``: what a piece of GPU work is, by its name."""
    return (
        "gpu_memcpy"
        if name.startswith("Memcpy")
        else "gpu_memset"
        if name.startswith("Memset")
        else "kernel"
    )


Span = tuple[int, int, int, Work, dict[str, Any]]  # (start, end, call, begin marker, entry)


@dataclass
class Split:
    """A window's GPU work split by the markers: each call's, and the rest."""

    claimed: list[OpLaunch]
    rest: list[Work]  # work no logged call encloses (markers left out)
    current: dict[int, set[int]]  # device -> streams its calls' markers ran on
    legacy: dict[int, int]  # device -> the profiler id of its legacy default stream


def split_window(events: list[dict[str, Any]], log: list[dict[str, Any]]) -> Split | None:
    """None when the markers found do not match the log (a marker was lost)."""
    work = [
        Work(e["name"], int(e["device"]), int(e["stream"]), int(e["correlation"]))
        for e in events
        if e["type"] in GPU_WORK
    ]
    markers = [w for w in work if MARKER_KERNEL in w.name]
    if len(markers) != len(log):
        return None
    begin: dict[int, tuple[Work, dict[str, Any]]] = {}
    spans: list[Span] = []
    current: dict[int, set[int]] = {}
    legacy: dict[int, int] = {}
    for m, entry in zip(markers, log, strict=True):
        if m.device != entry["device"]:
            return None
        if entry["edge"] == "legacy":
            legacy[m.device] = m.stream
            continue
        current.setdefault(m.device, set()).add(m.stream)
        if entry["edge"] == "begin":
            begin[entry["call"]] = (m, entry)
        elif entry["call"] in begin:
            bm, be = begin.pop(entry["call"])
            spans.append((bm.correlation, m.correlation, entry["call"], bm, be))
    claimed, rest = [], []
    enclosing = innermost(work, spans)
    for i, w in enumerate(work):
        if MARKER_KERNEL in w.name:
            continue
        span = enclosing.get(i)
        if span is None:
            rest.append(w)  # torch's own work, or an unwatched caller's
            continue
        _, _, call, marker, entry = span
        if entry["op"] == ASIDE:
            continue  # gpucheck's own work around a call: neither an op's nor unclaimed
        claimed.append(
            OpLaunch(
                str(entry["op"]),
                call,
                w,
                marker.device,
                marker.stream,
                bool(entry.get("single_device", True)),
                entry.get("frame"),
            )
        )
    return Split(claimed, rest, current, legacy)


def innermost(work: list[Work], spans: list[Span]) -> dict[int, Span]:
    """For each piece of work (by index) the span that encloses its correlation id
    (``start < id < end``) with the latest start: the innermost call. One sweep in id order
    with a heap of the spans begun, latest start on top (a window holds thousands of
    kernels and hundreds of calls: no pairwise comparison)."""
    order = sorted(range(len(work)), key=lambda i: work[i].correlation)
    by_start = sorted(spans, key=lambda s: s[0])
    begun: list[tuple[int, int, Span]] = []  # (-start, position, span)
    found: dict[int, Span] = {}
    nxt = 0
    for i in order:
        c = work[i].correlation
        while nxt < len(by_start) and by_start[nxt][0] < c:
            heapq.heappush(begun, (-by_start[nxt][0], nxt, by_start[nxt]))
            nxt += 1
        while begun and begun[0][2][1] <= c:  # ended: it encloses no later id either
            heapq.heappop(begun)
        if begun:
            found[i] = begun[0][2]
    return found


def attribute(events: list[dict[str, Any]], log: list[dict[str, Any]]) -> list[OpLaunch]:
    """The GPU work of each logged call. ``log`` holds, in launch order, one entry per marker:
    ``{"edge": "begin"|"end", "call": i, "op": name, "device": d, "single_device": bool,
    "frame": "file:line in fn"}`` (and ``{"edge": "legacy", "device": d}`` for a marker on
    the legacy default stream). Returns [] when the markers found do not match the log (a
    marker was lost: no judgement rather than a guess)."""
    split = split_window(events, log)
    return [] if split is None else split.claimed


def torch_kernel(name: str) -> bool:
    """Whether a kernel is torch's or a vendor library's that torch calls, by its qualified
    name (template and call arguments left out: ``my::k<at::Half>`` is not torch's)."""
    path = name_path(name)
    if isinstance(path, str):  # a mangled name
        return any(p in path.lower() for p in TORCH_KERNELS)
    return bool(path) and (
        path[0] in TORCH_NAMESPACES or any(p in "::".join(path).lower() for p in TORCH_KERNELS)
    )


def candidates(events: list[dict[str, Any]], log: list[dict[str, Any]]) -> list[Work]:
    """Kernels of a window that no logged call encloses, that ran on a device where calls
    were logged but on a stream none of them had current, and that are not torch's own: the
    kernels whose library is looked up when the window closes."""
    split = split_window(events, log)
    return [] if split is None else candidates_of(split)


def candidates_of(split: Split) -> list[Work]:
    return [
        w
        for w in split.rest
        if w.device in split.current
        and work_kind(w.name) == "kernel"
        and w.stream not in split.current[w.device]
        and not torch_kernel(w.name)
    ]


@dataclass(frozen=True)
class MisplacedLaunch:
    """What one (op, kernel) did wrong in a window."""

    kind: str  # "wrong-stream" | "kernel-device"
    op: str
    kernel: str
    device: int  # the op's input device
    ran_on: tuple[int, ...]  # streams (wrong-stream) or devices (kernel-device)
    expected: int  # the current stream (wrong-stream) or the input device (kernel-device)
    count: int
    frame: str | None = None  # the Python line of the (first) call


def judge(launches: Iterable[OpLaunch]) -> list[MisplacedLaunch]:
    """Kernels of an op on another device than its inputs' (``kernel-device``), and kernels
    on its inputs' device on another stream than the caller's current one (``wrong-stream``).
    """
    bad: dict[tuple[str, str, str, int, int], list[int]] = {}
    frames: dict[tuple[str, str, str, int, int], str | None] = {}
    for lc in launches:
        w = lc.work
        key: tuple[str, str, str, int, int] | None = None
        if w.device != lc.device:
            if lc.single_device:
                key = ("kernel-device", lc.op, w.name, lc.device, lc.device)
                bad.setdefault(key, []).append(w.device)
        elif w.stream != lc.stream:
            key = ("wrong-stream", lc.op, w.name, lc.device, lc.stream)
            bad.setdefault(key, []).append(w.stream)
        if key is not None:
            frames.setdefault(key, lc.frame)
    return [
        MisplacedLaunch(
            kind,
            op,
            kernel,
            dev,
            tuple(sorted(set(v))),
            exp,
            len(v),
            frames.get((kind, op, kernel, dev, exp)),
        )
        for (kind, op, kernel, dev, exp), v in bad.items()
    ]


@dataclass(frozen=True)
class Unclaimed:
    """A kernel no watched call launched, on a stream no caller had current."""

    kernel: str
    library: str | None  # the compiled extension that defines it (None: not found)
    device: int
    ran_on: tuple[int, ...]  # the profiler's stream ids it ran on
    current: tuple[int, ...]  # the streams the window's calls had current on that device
    legacy: bool  # it ran on the legacy default stream
    count: int


def unclaimed(window: Window) -> list[Unclaimed]:
    """The kernels of a window that no watched call claims and that ran on a stream no
    caller had current (see the module text): those found in a watched extension's library,
    and those found nowhere that ran on the legacy default stream."""
    split = window.split
    if split is None:
        return []
    found: dict[tuple[str, int], list[Work]] = {}
    for w in candidates_of(split):
        lib = window.libraries.get(w.name)
        if lib is not None and set(lib.split(ext_watch.LIBRARY_SEP)) <= set(window.unwatched):
            continue  # its module is opted out
        if lib is None and split.legacy.get(w.device) != w.stream:
            continue  # not an extension's that we know, nor on stream 0: torch's, likely
        found.setdefault((w.name, w.device), []).append(w)
    return [
        Unclaimed(
            name,
            window.libraries.get(name),
            dev,
            tuple(sorted({w.stream for w in ws})),
            tuple(sorted(split.current[dev])),
            any(w.stream == split.legacy.get(dev) for w in ws),
            len(ws),
        )
        for (name, dev), ws in found.items()
    ]


@dataclass
class Window:
    """What one profiled window saw: plain data (what the fixtures hold)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)
    streams: dict[int, str] = field(default_factory=dict)  # device -> repr of a current stream
    #: kernel -> the compiled extension library that defines it (:func:`candidates` only)
    libraries: dict[str, str | None] = field(default_factory=dict)
    unwatched: list[str] = field(default_factory=list)  # libraries of opted-out modules
    #: what recorded it: "callbacks" (CUPTI's callback API: streams are handles, 0 the legacy
    #: default stream) or "kineto" (profiler windows: streams are CUPTI's ids)
    recorder: str = "kineto"

    @cached_property
    def split(self) -> Split | None:
        """The window's work split by its markers, once (every detector reads it): None when
        the markers do not match the log. Read after the window closed."""
        return split_window(self.events, self.log)

    def launches(self) -> list[OpLaunch]:
        """:func:`attribute` of this window."""
        split = self.split
        return [] if split is None else split.claimed


def kernel_list(names: list[str], shown: int = 3) -> str:
    """``kern`` for one kernel, ``3 kernels (a, b, c)`` for several: how one finding about an
    op (or a library) names the kernels it launched."""
    if len(names) == 1:
        return names[0]
    more = ", ..." if len(names) > shown else ""
    return f"{len(names)} kernels ({', '.join(names[:shown])}{more})"
