"""Where the GPU work of each extension-op call ran: device and stream, from the profiler.

Shared by two detectors (``wrong-stream`` and ``kernel-device``); not a detector itself.

How it works, and why it is cheap:

- While a window is open, every kernel launch, copy and memset is recorded with its device
  and stream, in order. Two recorders: CUPTI's callback API
  (:mod:`gpucheck.detectors.launch_callbacks`: at each launch call, the stream from its own
  arguments as a handle, 0 the legacy default stream; markers are places in its sequence, no
  kernel), the default where its library builds and CUPTI is free (not when
  ``GPUCHECK_LAUNCH_TRACE=kineto``); else kineto's profiler with CUDA
  activity only (kernels, copies, memsets with device, stream and CUPTI correlation id; no
  host ops), whose streams are CUPTI's ids and whose markers are kernels. Once a process has
  had a kineto window CUPTI stays attached to it, which costs every later launch (see
  ``benchmarks/cupti_window.py``); the callback recorder lets CUPTI go at each window's end.
  What follows reads the same for both: work, markers, ids in launch order.
- Around each call of an extension op (:mod:`gpucheck.detectors.op_watch`) the trace launches
  a marker, ``torch.cuda._sleep(0)`` (a kernel named ``spin_kernel`` that nothing else
  launches), on the current stream of the op's *input* device, before and after the call, and
  logs the call. Correlation ids grow with every CUDA API call of the process, so the GPU work
  whose id lies between a call's two markers was launched during that call (the innermost
  call, for nested ones); the marker's own stream is the stream the caller had made current
  on that device.
- A window opens at an extension-op call (on the main thread) and closes as soon as it can:
  after the call when none of its outputs requires grad (and it was not made from an
  ``autograd.Function``'s forward with inputs that require grad: a pybind function's outputs
  get their grad_fn only when ``apply`` returns), else after the next
  ``torch.autograd.backward`` / ``grad`` returns (where the op's backward ran: calls from the
  autograd engine's threads are logged while the window is open), and at the latest at the
  end of the case. Kernels of torch's own that run between calls (a reference computed on
  the GPU) are then not traced. A callback window also closes, keeping what it recorded, when
  a profiler of the test's is about to start (CUPTI takes one subscriber: kineto, refused,
  would give that profiler and every later one of the process no GPU events); the op's
  backward is then not traced. gpucheck's own work around a call while a window is open
  (:func:`op_watch.aside <gpucheck.detectors.op_watch.aside>`: the unwritten-output probe's
  re-runs of the op, numerics' hashing) is fenced by markers like a call and left out of the
  judgement: a re-run that launches on stream 0 is the op's finding already, not a kernel
  without a caller (the callback recorder does not even record that thread's launches
  meanwhile: nothing to read back and split). Each (op, argument signature) is profiled for
  its first :data:`CAP` calls per case: a gradcheck that calls an op thousands of times is
  judged on its first calls, not profiled throughout.
- **Kernels without a caller** (:func:`~.launch_windows.unclaimed`): the first marker of a window
  on a device is preceded by one on that device's legacy default stream (stream 0), which tells
  its profiler id. A kernel of the window that no logged call's markers enclose, on a stream that
  no marker of its device ran on (no caller had it current), is looked up in the symbol tables of
  the compiled torch extensions of the process (:func:`gpucheck.detectors.ext_watch.locate`, when
  the window closes; the profiler does not say which library launched a kernel): found there, or
  not found but on the legacy default stream, it is a case-level ``wrong-stream`` finding naming
  the kernel and its library. Kernels of torch itself and of the vendor libraries it calls
  (:data:`~.launch_windows.TORCH_NAMESPACES`, :data:`~.launch_windows.TORCH_KERNELS`) are never
  judged so, and neither are copies and memsets. A launch made while no window is open is not
  seen.

What it costs goes under ``launch-trace`` in each case's ``cost_s``: its listener's time around
the calls, and what it takes where no listener's time is counted: the callback recorder's own
time at the case's launches, and a window closed at a backward's end or a profiler's start
(its read and split).

This module records the windows; what a window saw and the judgement on it, pure functions on
plain data (:func:`~.launch_windows.attribute`, :func:`~.launch_windows.judge`,
:func:`~.launch_windows.unclaimed`), are :mod:`gpucheck.detectors.launch_windows`, so CI tests
them on windows recorded on a GPU (tests/fixtures/launches/).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any

from gpucheck.detectors import ext_watch, launch_callbacks, op_watch
from gpucheck.detectors.launch_windows import (
    ASIDE,
    MARKER_KERNEL,
    Window,
    candidates_of,
    work_kind,
)
from gpucheck.model.results import Severity

#: profiled calls per (op, argument signature) and case
CAP = 16


def gpu_events(result: Any) -> list[dict[str, Any]]:
    """The GPU work of a kineto result as plain dicts (``name``, ``type``, ``device``,
    ``stream``, ``correlation``), in launch order."""
    from torch.autograd import DeviceType

    rows = []
    for e in result.events():
        if e.device_type() != DeviceType.CUDA or e.is_user_annotation():
            continue
        rows.append(
            {
                "name": e.name(),
                "type": work_kind(e.name()),
                "device": e.device_index(),
                "stream": e.device_resource_id(),
                "correlation": e.correlation_id(),
            }
        )
    rows.sort(key=lambda r: r["correlation"])
    return rows


def _marker(seq: int, device: int, stream: int) -> dict[str, Any]:
    """A marker of a callback window: a place in the recorder's sequence, as the GPU work of a
    profiler window's marker kernel would read."""
    return {
        "name": MARKER_KERNEL,
        "type": "kernel",
        "device": device,
        "stream": stream,
        "correlation": seq,
    }


def _launch_event(launch: launch_callbacks.Launch) -> dict[str, Any]:
    """A callback recorder's launch as the GPU work of a window (see :func:`gpu_events`)."""
    return {
        "name": launch.name,
        "type": launch.kind,
        "device": launch.device,
        "stream": launch.stream,
        "correlation": launch.seq,
    }


class LaunchTrace:
    """The op_watch listener and profiler windows of one worker (see the module text)."""

    name = "launch-trace"  # its seconds around the calls, in a case's ``cost_s``

    def __init__(self, cap: int = CAP) -> None:
        self.cap = cap
        self.lock = threading.RLock()
        self.active = False
        self.open = False
        self.failed: BaseException | None = None
        self.windows: list[Window] = []
        self.window = Window()
        self.counts: dict[tuple[Any, ...], int] = {}
        self.devices: set[int] = set()
        self.calls = 0
        self.depth = 0
        self.backward_pending = False
        self.callbacks: launch_callbacks.Recorder | None = None  # the open window's recorder
        #: (severity, sentence) of what kept the trace from its work or its fast recorder, for
        #: the first detector that reads the case (:meth:`take_problems`)
        self.problems: list[tuple[Severity, str]] = []
        self.told_recorder = False  # the fallback to kineto is told once per process
        self.asides: dict[int, dict[str, Any]] = {}  # thread -> its aside's entry, under way
        #: thread -> the callback recorder told that the thread's aside started (told its end)
        self.skipping: dict[int, launch_callbacks.Recorder] = {}

    # -- the case ---------------------------------------------------------------------------
    def acquire(self) -> None:
        """A detector starts reading the case (the first one starts the trace)."""
        with self.lock:
            if not self.active:
                self.windows, self.counts, self.failed = [], {}, None
                self.active = op_watch.add(self)
                if self.active:
                    _watch_torch()
                    op_watch.ASIDE_OBSERVERS.append(self.aside)

    def take_problems(self) -> list[tuple[Severity, str]]:
        """What kept the trace from its work since the last call (see ``problems``): the
        first detector reading the case reports it, once."""
        with self.lock:
            problems, self.problems = self.problems, []
            return problems

    def finish(self) -> list[Window]:
        """A detector is done with the case: the first call stops the trace; every call
        returns the windows of the case."""
        with self.lock:
            if self.active:
                self.active = False
                op_watch.remove(self)
                if self.aside in op_watch.ASIDE_OBSERVERS:
                    op_watch.ASIDE_OBSERVERS.remove(self.aside)
                self._close()
            return self.windows

    # -- op_watch listener ------------------------------------------------------------------
    def before(self, call: op_watch.Call) -> None:
        dev = op_watch.input_device(call)
        if dev is None or op_watch.capturing():
            return
        tensors = call.inputs
        key = (call.op, *((str(t.dtype), tuple(t.shape)) for t in tensors))
        main = threading.current_thread() is threading.main_thread()
        with self.lock:
            if not self.open:
                if not main or self.counts.get(key, 0) >= self.cap or self.failed:
                    return
                if not self._open():
                    return
            self.counts[key] = self.counts.get(key, 0) + 1
            entry = {
                "call": self.calls,
                "op": call.op,
                "device": int(dev.index),
                "single_device": len({t.device for t in tensors}) == 1,
                "frame": call.frame,
            }
            self.calls += 1
            call.notes["launch-trace"] = entry
            self.depth += 1
            self._mark(dict(entry, edge="begin"))

    def after(self, call: op_watch.Call, out: Any) -> None:
        entry = call.notes.get("launch-trace")
        if entry is None:
            return
        with self.lock:
            if not self.open:
                return
            self._mark(dict(entry, edge="end"))
            self.depth -= 1
            if self.depth or threading.current_thread() is not threading.main_thread():
                return
            grads = any(t.requires_grad for t in call.outputs(out)) or (
                call.autograd == "forward"  # its grad_fn comes when apply returns
                and any(t.requires_grad for t in call.inputs)
            )
            if not grads or all(n >= self.cap for n in self.counts.values()):
                self._close()
            else:
                self.backward_pending = True

    def aside(self, started: bool) -> None:
        """gpucheck's own work around a call starts or ends (an op_watch aside observer):
        while a window is open, markers fence it like a call whose launches are not judged
        (the callback recorder does not even record this thread's launches meanwhile)."""
        torch = sys.modules["torch"]
        thread = threading.get_ident()
        with self.lock:
            told = None if started else self.skipping.pop(thread, None)
            if told is not None:  # its end, whether the window is still open or not
                told.aside(False)
            if not self.open or not torch.cuda.is_initialized():
                self.asides.pop(thread, None)
                return
            if started:
                entry = {"call": self.calls, "op": ASIDE, "device": torch.cuda.current_device()}
                self.calls += 1
                self.asides[thread] = entry
                self._mark(dict(entry, edge="begin", single_device=True, frame=None))
                if self.callbacks is not None:
                    self.callbacks.aside(True)
                    self.skipping[thread] = self.callbacks
            elif thread in self.asides:
                entry = self.asides.pop(thread)
                self._mark(dict(entry, edge="end", single_device=True, frame=None))

    def backward_done(self) -> None:
        """``torch.autograd.backward`` / ``grad`` returned (on the main thread)."""
        with self.lock:
            if self.open and self.backward_pending and self.depth == 0:
                self._close_outside()

    def let_cupti_go(self) -> None:
        """A profiler (kineto) is about to start: close a callback window now."""
        with self.lock:
            if self.callbacks is not None:
                self._close_outside()

    def _close_outside(self) -> None:
        """Close the window where no listener's time is counted (the backward's end, a
        profiler's start): its seconds go to the trace's ``cost_s`` all the same."""
        t0 = time.perf_counter()
        try:
            self._close()
        finally:
            op_watch.charge(self.name, time.perf_counter() - t0)

    # -- internals --------------------------------------------------------------------------
    def _mark(self, entry: dict[str, Any]) -> None:
        torch = sys.modules["torch"]
        d = entry["device"]
        if self.callbacks is not None:  # markers are places in the recorder's sequence
            if d not in self.window.streams:
                self.window.events.append(_marker(self.callbacks.mark(), d, 0))
                self.window.log.append({"edge": "legacy", "call": -1, "op": "", "device": d})
                self.window.streams[d] = repr(torch.cuda.current_stream(d))
            stream = int(torch.cuda.current_stream(d).cuda_stream)
            self.window.events.append(_marker(self.callbacks.mark(), d, stream))
            self.window.log.append(entry)
            return  # nothing to synchronize at the close: the devices are not kept
        current = int(torch.cuda.current_device())
        with contextlib.nullcontext() if d == current else torch.cuda.device(d):
            if d not in self.window.streams:  # the first marker on d: name its stream 0 too
                with torch.cuda.stream(torch.cuda.default_stream(d)):
                    torch.cuda._sleep(0)
                self.window.log.append({"edge": "legacy", "call": -1, "op": "", "device": d})
                self.window.streams[d] = repr(torch.cuda.current_stream(d))
            torch.cuda._sleep(0)  # on d's current stream
        self.window.log.append(entry)
        self.devices.add(d)
        self.devices.add(current)

    def _open(self) -> bool:
        torch = sys.modules["torch"]
        if torch._C._autograd._profiler_enabled():
            return False  # someone else profiles (a test's own profiler): leave it alone
        recorder = launch_callbacks.recorder()
        if recorder is not None and recorder.open() == 0:
            global _holder
            self._started(Window(recorder="callbacks"))
            self.callbacks, _holder = recorder, self
            return True
        if recorder is None and not self.told_recorder and launch_callbacks.asked() != "kineto":
            self.told_recorder = True
            self.problems.append(
                (
                    "info",
                    "ran with the launch trace on kineto's profiler windows in this worker, not "
                    f"the CUPTI-callback recorder ({launch_callbacks.why_not}): the checks are "
                    "the same, but each window costs ~1.5 ms instead of ~0.05 ms and, once "
                    "CUPTI is attached, every later launch a few µs more "
                    f"({launch_callbacks.BACKEND_ENV}=kineto asks for this and is not told)",
                )
            )
        # no recorder, or CUPTI is held (a profiler of the test's, earlier in the process)
        from torch._C._profiler import (
            ProfilerActivity,
            ProfilerConfig,
            ProfilerState,
            _ExperimentalConfig,
        )
        from torch.autograd.profiler import _enable_profiler, _prepare_profiler

        config = ProfilerConfig(
            ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig()
        )
        try:
            _prepare_profiler(config, {ProfilerActivity.CUDA})
            _enable_profiler(config, {ProfilerActivity.CUDA})
        except Exception as err:
            self.failed = err
            self.problems.append(
                (
                    "warning",
                    f"could not start the launch trace (kineto's profiler: {type(err).__name__}: "
                    f"{err}): the kernels of the case's later op calls were not traced",
                )
            )
            return False
        self._started(Window())
        return True

    def _started(self, window: Window) -> None:
        self.open = True
        self.backward_pending = False
        self.window = window
        self.callbacks = None
        self.devices = set()
        self.calls = 0
        self.depth = 0

    def _close(self) -> None:
        if not self.open:
            return
        self.open = False
        if self.callbacks is not None:  # recorded at each launch: nothing to wait for
            global _holder
            recorder, self.callbacks = self.callbacks, None
            recorder.close()
            if _holder is self:
                _holder = None
            # what the recorder took at the case's own launches (inside the calls and torch's
            # work between them, where no listener's time is counted)
            op_watch.charge(self.name, recorder.spent())
            self.window.events = sorted(
                self.window.events + [_launch_event(x) for x in recorder.take()],
                key=lambda e: e["correlation"],
            )
            self._keep_window()
            return
        torch = sys.modules["torch"]
        from torch.autograd.profiler import _disable_profiler

        try:
            for d in sorted(self.devices):  # GPU activity is collected once it has run
                torch.cuda.synchronize(d)
        except Exception as err:  # a lost context: the case's own record says why
            _disable_profiler()
            self.failed = err
            return
        self.window.events = gpu_events(_disable_profiler())
        self._keep_window()

    def _keep_window(self) -> None:
        self.windows.append(self.window)
        split = self.window.split
        names = sorted({w.name for w in candidates_of(split)}) if split is not None else []
        if names:  # while the libraries are mapped: the judgement is on plain data
            self.window.libraries, self.window.unwatched = ext_watch.locate(names)


#: the worker's one trace, shared by the detectors that read it
TRACE = LaunchTrace()
#: the trace whose callback window holds CUPTI now (CUPTI takes one subscriber a process)
_holder: LaunchTrace | None = None
_torch_watched = False


def _watch_torch() -> None:
    """Wrap, once per process, ``torch.autograd.backward`` and ``grad`` (a window kept open for
    an op's backward closes when the backward pass returns) and the profiler's
    ``_prepare_profiler`` (where kineto takes CUPTI, for ``torch.profiler.profile`` and
    ``torch.autograd.profiler.profile``: an open callback window lets it go first)."""
    global _torch_watched
    if _torch_watched:
        return
    import functools

    import torch.autograd
    import torch.autograd.profiler

    for name in ("backward", "grad"):
        original = getattr(torch.autograd, name)

        @functools.wraps(original)
        def wrapped(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            try:
                return _original(*args, **kwargs)
            finally:
                if TRACE.open and threading.current_thread() is threading.main_thread():
                    TRACE.backward_done()

        setattr(torch.autograd, name, wrapped)

    prepare = torch.autograd.profiler._prepare_profiler

    @functools.wraps(prepare)
    def prepare_profiler(*args: Any, **kwargs: Any) -> Any:
        holder = _holder
        if holder is not None:
            holder.let_cupti_go()
        return prepare(*args, **kwargs)

    torch.autograd.profiler._prepare_profiler = prepare_profiler
    _torch_watched = True
