"""Every call of an extension op, seen from Python at almost no cost to torch's own ops.

Detectors that judge ops one call at a time (output device, device-state leak, launch
stream and device, fingerprints of results) need to run code around each call of an
extension op (``torch.ops.<namespace>.<op>`` of any namespace but torch's own). A
``TorchDispatchMode`` would do that but makes *every* aten op take a detour through Python
(gradcheck cases run tens of thousands of them: +13 % of suite time measured on an H200).
Calls from Python go through ``OpOverloadPacket.__call__`` / ``OpOverload.__call__``
instead, so the watch wraps those two methods once per process: an aten call pays one
attribute read and a tuple lookup, an extension call runs the listeners.

The functions of compiled extension modules (pybind11 ``PYBIND11_MODULE``s, which never reach
the dispatcher) come through the same path: :mod:`gpucheck.detectors.ext_watch` wraps them
and calls :func:`watched` with the name ``package._C.function``, so every listener sees them
like ops. What the watch does not see: ops and functions called from C++ (an autograd formula
registered in C++ calling the backward op). The case-level checks (``device_state``, the
differential re-run, the sanitizer, the launch trace's unclaimed kernels) cover those.

Each :class:`Call` carries the Python frame that made it (``frame``: the nearest frame
outside gpucheck's own code and torch's, e.g. the ``autograd.Function.forward`` line that
called the extension) and whether it was made from an ``autograd.Function``'s ``forward`` or
``backward`` (``autograd``), so findings can point at the line to look at.

Listeners are objects with ``before(call)`` and ``after(call, out)``; ``after`` also runs
(with ``out=None`` and ``call.error`` set) when the op raises. A listener must never raise:
its exceptions are kept in :data:`errors` and reported by the detector that owns it. The
seconds each listener takes are counted under its ``name`` (:func:`take_spent`: a case's
``cost_s``), the watch's own under ``op-watch``; what a listener spends elsewhere in the case
(outside its ``before`` / ``after``) it counts itself with :func:`charge`.

A listener's own work around a call that runs the GPU (a re-run of the call on copies of its
arguments, a hash of its outputs) runs inside :func:`aside`: watched calls made there are not
watched (the re-run is not the case's call), and :data:`ASIDE_OBSERVERS` are told where it
starts and ends (a sanitizer pass leaves out what compute-sanitizer reported in between: it is
gpucheck's work, not the case's).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from types import CodeType, FrameType
from typing import Any, Protocol

from gpucheck._resources import own_code

#: namespaces of torch itself: never watched
TORCH_NAMESPACES = (
    "aten",
    "prim",
    "prims",
    "_c10d_functional",
    "c10d",
    "profiler",
    "quantized",
    "rngprims",
    "higher_order",
    "inductor",
    "_test",
    "debugprims",
)


@dataclass
class Call:
    """One call of an extension op (or of a compiled extension module's function)."""

    op: str  # "namespace::name" (overload left out), or "package._C.function"
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    thread: int
    error: BaseException | None = None
    notes: dict[str, Any] = field(default_factory=dict)  # listeners' per-call state
    frame: str | None = None  # "file.py:12 in Rasterize.forward", the caller's line
    autograd: str | None = None  # "forward" | "backward" of an autograd.Function made the call
    fn: Any = None  # the op object or function called (its argument names)
    depth: int = 0  # watched calls of this thread under way around it (0: the outermost)

    @cached_property
    def inputs(self) -> list[Any]:
        """The tensors among the call's arguments (found once: every listener reads them)."""
        return tensors((self.args, self.kwargs))

    def outputs(self, out: Any) -> list[Any]:
        """The tensors among what the call returned (``out``), found once per call."""
        found = self.notes.get(_OUTPUTS)
        if found is None or found[0] is not out:
            found = self.notes[_OUTPUTS] = (out, tensors(out))
        return found[1]


_OUTPUTS = "op_watch.outputs"  # the notes key of Call.outputs


class Listener(Protocol):
    def before(self, call: Call) -> None: ...

    def after(self, call: Call, out: Any) -> None: ...


_listeners: list[Listener] = []
_lock = threading.Lock()
_installed = False
_depth = threading.local()  # .n: watched calls under way on this thread; .aside: see aside()
#: exceptions raised by listeners (a listener must never fail the op), by listener
errors: dict[int, BaseException] = {}


def _op_name(obj: Any) -> tuple[str, str]:
    """(namespace, "namespace::name") of an OpOverloadPacket or OpOverload."""
    packet = getattr(obj, "overloadpacket", obj)
    qual = str(getattr(packet, "_qualified_op_name", "") or "")
    ns, _, name = qual.partition("::")
    return ns, qual if name else str(obj)


def _run(obj: Any, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    ns, name = _op_name(obj)
    if not _listeners or ns in TORCH_NAMESPACES:
        return original(obj, *args, **kwargs)
    return _watched(name, lambda: original(obj, *args, **kwargs), args, kwargs, obj)


#: the attribute of an ext_watch wrapper that holds the function it wraps
ORIGINAL = "__gpucheck_original__"


def watching() -> bool:
    """Whether any listener is active (a wrapper's fast path when not)."""
    return bool(_listeners)


def watch_call(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` as a watched extension op named ``name`` (for functions
    the watch cannot see by itself: Python wrappers; a compiled extension's function that
    :mod:`~gpucheck.detectors.ext_watch` wraps is called unwrapped here, watched once)."""
    fn = getattr(fn, ORIGINAL, fn)
    if not _listeners:
        return fn(*args, **kwargs)
    return _watched(name, lambda: fn(*args, **kwargs), args, kwargs, fn)


def watched(name: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)`` as a watched call named ``name`` (ext_watch's wrappers)."""
    return _watched(name, lambda: fn(*args, **kwargs), args, kwargs, fn)


#: the ``cost_s`` key of the watch's own part of a call (the caller's frame, the record of
#: the call); each listener's part goes under its ``name`` (a detector's), else its class's
WATCH = "op-watch"
#: seconds taken around calls (every thread) since the last :func:`take_spent`, by whom: the
#: per-call part of what the checks cost
_spent: dict[str, float] = {}


def spent() -> float:
    """Seconds taken around calls since the last :func:`take_spent`, all together."""
    return sum(_spent.values())


def take_spent() -> dict[str, float]:
    """Seconds taken around calls since the last call of this, by the listener that took
    them (:data:`WATCH`: the watch's own); starts again at nothing."""
    global _spent
    taken, _spent = _spent, {}
    return taken


def charge(who: str, seconds: float) -> None:
    """Count ``seconds`` taken for the watch's listeners under ``who`` (what a listener spends
    outside its ``before`` / ``after``, e.g. the launch trace's window read at a backward's
    end): they go into the case's ``cost_s`` with the rest (:func:`take_spent`)."""
    _spent[who] = _spent.get(who, 0.0) + seconds


def _name(listener: Any) -> str:
    return getattr(listener, "name", None) or type(listener).__name__


#: called with True when a thread enters :func:`aside` (the outermost) and False when it
#: leaves: a callable that must not raise (what it raises is dropped)
ASIDE_OBSERVERS: list[Callable[[bool], None]] = []


@contextlib.contextmanager
def aside() -> Iterator[None]:
    """A listener's own work around a call (a re-run outside the case's result, a hash of its
    outputs): extension calls made inside it on this thread are not watched, and
    :data:`ASIDE_OBSERVERS` are told where it starts and ends."""
    depth = getattr(_depth, "aside", 0)
    _depth.aside = depth + 1
    if not depth:
        _tell(True)
    try:
        yield
    finally:
        _depth.aside = depth
        if not depth:
            _tell(False)


def _tell(started: bool) -> None:
    for observer in list(ASIDE_OBSERVERS):
        with contextlib.suppress(Exception):
            observer(started)


def _watched(
    name: str, invoke: Any, args: tuple[Any, ...], kwargs: dict[str, Any], fn: Any = None
) -> Any:
    if getattr(_depth, "aside", 0):
        return invoke()  # a listener's own re-run of a call: not the case's
    t0 = time.perf_counter()
    listeners = _listeners
    frame, autograd = caller()
    depth = getattr(_depth, "n", 0)
    call = Call(
        name,
        args,
        kwargs,
        threading.get_ident(),
        frame=frame,
        autograd=autograd,
        fn=fn,
        depth=depth,
    )
    active = list(listeners)
    t = time.perf_counter()
    charge(WATCH, t - t0)
    for li in active:
        try:
            li.before(call)
        except Exception as err:
            errors.setdefault(id(li), err)
        now = time.perf_counter()
        charge(_name(li), now - t)
        t = now
    _depth.n = depth + 1
    try:
        out = invoke()
    except BaseException as err:
        _depth.n = depth
        call.error = err
        _after(active, call, None)
        raise
    _depth.n = depth
    _after(active, call, out)
    return out


def _after(active: list[Listener], call: Call, out: Any) -> None:
    """The listeners' ``after``, last first, each charged for its time."""
    t = time.perf_counter()
    for li in reversed(active):
        try:
            li.after(call, out)
        except Exception as err:
            errors.setdefault(id(li), err)
        now = time.perf_counter()
        charge(_name(li), now - t)
        t = now


# -- the caller's frame --------------------------------------------------------------------

_kinds: dict[CodeType, int] = {}
_USER, _INTERNAL, _AUTOGRAD_APPLY = 0, 1, 2


def torch_dir() -> str | None:
    """torch's package folder (with a trailing separator), None before torch is imported."""
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    return os.path.dirname(path) + os.sep if path else None


def _kind(code: CodeType) -> int:
    """Whether a frame's code is the caller's (0), gpucheck's or torch's (1), or torch's
    ``autograd.Function.apply``, which calls ``forward`` / ``backward`` (2)."""
    kind = _kinds.get(code)
    if kind is None:
        path = code.co_filename
        torch_path = torch_dir()
        if torch_path and path.startswith(torch_path):
            kind = (
                _AUTOGRAD_APPLY
                if code.co_name == "apply"
                and path.endswith(os.path.join("autograd", "function.py"))
                else _INTERNAL
            )
        elif own_code(path):
            kind = _INTERNAL
        else:
            kind = _USER
        _kinds[code] = kind
    return kind


_shown: dict[CodeType, str] = {}


def _label(f: FrameType) -> str:
    code = f.f_code
    shown = _shown.get(code)
    if shown is None:  # once per code object: relpath is not free
        path = code.co_filename
        try:
            rel = os.path.relpath(path)
            path = path if rel.startswith("..") else rel
        except ValueError:  # another drive
            pass
        shown = _shown[code] = f"{path}:{{}} in {getattr(code, 'co_qualname', code.co_name)}"
    return shown.format(f.f_lineno)


def caller(depth: int = 2) -> tuple[str | None, str | None]:
    """(frame, autograd) of the call being watched: the nearest frame outside gpucheck's own
    code and torch's as ``file:line in qualname`` (the nearest frame at all when every frame
    is theirs), and ``"forward"`` / ``"backward"`` when that frame runs inside an
    ``autograd.Function``'s forward or backward (called by its ``apply``)."""
    try:
        f: FrameType | None = sys._getframe(depth)
    except ValueError:
        return None, None
    first = f
    while f is not None and _kind(f.f_code) != _USER:
        f = f.f_back
    if f is None:
        return (_label(first) if first is not None else None), None
    outer, autograd = f.f_back, None
    for _ in range(4):  # decorators (custom_fwd) may sit between forward and apply
        if outer is None or _kind(outer.f_code) == _USER:
            break
        if _kind(outer.f_code) == _AUTOGRAD_APPLY:
            autograd = "backward" if "backward" in f.f_code.co_name else "forward"
            break
        outer = outer.f_back
    return _label(f), autograd


def install() -> bool:
    """Wrap the call methods of torch's op objects (once per process). False when torch is
    not imported (nothing to watch yet)."""
    global _installed
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    with _lock:
        if _installed:
            return True
        from torch._ops import OpOverload, OpOverloadPacket

        for cls in (OpOverloadPacket, OpOverload):
            original = cls.__call__

            def wrapped(self: Any, /, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                return _run(self, _original, args, kwargs)

            wrapped.__wrapped__ = original  # type: ignore[attr-defined]
            cls.__call__ = wrapped  # type: ignore[method-assign]
        _installed = True
    return True


def add(listener: Listener) -> bool:
    """Start calling ``listener`` around extension ops; False when torch is not imported."""
    if not install():
        return False
    global _listeners
    with _lock:
        if listener not in _listeners:
            _listeners = [*_listeners, listener]  # copy on write: calls iterate a snapshot
    return True


def remove(listener: Listener) -> BaseException | None:
    """Stop calling ``listener``; returns the first exception it raised, if any."""
    global _listeners
    with _lock:
        _listeners = [li for li in _listeners if li is not listener]
    return errors.pop(id(listener), None)


def tensors(obj: Any) -> list[Any]:
    """The tensors in (nested) args, kwargs or outputs, in pytree order. Tuples (named ones
    too), lists and dicts are walked here (an op's arguments and results are nearly always
    those, and this runs around every call); any other container torch's pytree knows is
    left to it."""
    torch = sys.modules["torch"]
    found: list[Any] = []
    _collect(obj, torch.Tensor, found)
    return found


def _collect(obj: Any, tensor: type, found: list[Any]) -> None:
    if isinstance(obj, tensor):
        found.append(obj)
    elif type(obj) in (tuple, list):
        for x in obj:
            _collect(x, tensor, found)
    elif type(obj) is dict:
        for x in obj.values():
            _collect(x, tensor, found)
    elif isinstance(obj, (str, int, float, bool, type(None))):
        return
    else:
        from torch.utils._pytree import tree_leaves

        found.extend(t for t in tree_leaves(obj) if isinstance(t, tensor))


def placeholder(t: Any) -> bool:
    """A tensor with no elements: the field's "not given" (``torch.Tensor([])``,
    ``torch.empty(0)`` for an optional argument or output the C++ side tests with
    ``.size(0)``). It holds no data, on whatever device it sits: the per-call device rules
    (mixed devices, output devices) leave it out. A size torch does not know yet (a symbolic
    one, under ``opcheck`` or ``torch.compile``) is not a placeholder: asking would make torch
    guard on it."""
    n = t.numel()
    return isinstance(n, int) and n == 0


def real_cuda(t: Any) -> bool:
    """A plain CUDA tensor with memory behind it (not fake, meta or a tensor subclass that
    traces, as under ``opcheck`` or ``torch.compile``)."""
    torch = sys.modules["torch"]
    return t.device.type == "cuda" and type(t) in (torch.Tensor, torch.nn.Parameter)


def input_device(call: Call) -> Any:
    """The device of the call's first real CUDA tensor argument (None: none, or a tensor of
    the call is fake/meta, e.g. under ``opcheck``)."""
    found = None
    for t in call.inputs:
        if t.device.type == "cuda" and not real_cuda(t):
            return None
        if found is None and t.device.type == "cuda":
            found = t.device
    return found


def capturing() -> bool:
    """True while the current stream is being captured into a CUDA graph (no extra launches
    or synchronizations then)."""
    torch = sys.modules["torch"]
    if not torch.cuda.is_initialized():
        return False
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:
        return True
