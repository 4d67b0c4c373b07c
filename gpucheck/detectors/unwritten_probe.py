"""The probe: which elements of an extension call's outputs the call never wrote.

A call is run twice more, outside the case's result (:func:`op_watch.aside
<gpucheck.detectors.op_watch.aside>`: no listener sees the re-runs; ``torch.no_grad``; on
copies of the arguments the call may write, taken before it ran: :func:`snapshot`; the random
generators set back to where they stood before the call, then to where the call left them),
under a ``TorchDispatchMode`` that fills every fresh allocation the call makes with a byte
pattern (:func:`filling`): ``0xA5`` in the first re-run, ``0x5A`` in the second. An element is
unwritten when it holds the first pattern after the first re-run and the second after the
second (:func:`unwritten`). :func:`probe` returns the call's
:class:`~gpucheck.detectors.unwritten.Evidence`, each gap judged by the rule
(:mod:`~gpucheck.detectors.unwritten_rule`), and records it in the process's memory
(:data:`~gpucheck.detectors.unwritten.MEMORY`). The shared module's text
(:mod:`gpucheck.detectors.unwritten`) says what is not judged.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpucheck.detectors import op_watch
from gpucheck.detectors.element_sets import describe, samples
from gpucheck.detectors.mixed_devices import argument_names
from gpucheck.detectors.unwritten import (
    CLEAN,
    FAILED,
    MEMORY,
    Convention,
    Evidence,
    Gap,
    output_names,
    remember,
    schema_of,
    signature,
)
from gpucheck.detectors.unwritten_rule import declared, marker

#: the bytes the two re-runs fill fresh allocations with (neither 0: an unwritten integer
#: marker never reads 0)
PATTERNS = (0xA5, 0x5A)
#: what allocates memory it does not write (the dispatcher's names)
ALLOCATIONS = frozenset(
    {
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::empty_permuted",
        "aten::new_empty",
        "aten::new_empty_strided",
    }
)
RESIZE = "aten::resize_"
_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def real(t: Any) -> bool:
    """A plain CPU or CUDA tensor with memory behind it."""
    torch = sys.modules["torch"]
    return t.device.type in ("cuda", "cpu") and type(t) in (torch.Tensor, torch.nn.Parameter)


def probeable(call: op_watch.Call) -> bool:
    """Whether a call can be probed at all: real tensors, not random, not under capture."""
    found = call.inputs
    if not found or not all(real(t) for t in found) or op_watch.capturing():
        return False
    seeded = _SEEDED.get(call.op)
    if seeded is None:
        seeded = _SEEDED[call.op] = _seeded(call.fn)
    return not seeded


_SEEDED: dict[str, bool] = {}  # op -> tagged random (looked up once)


def _seeded(fn: Any) -> bool:
    torch = sys.modules["torch"]
    tags = getattr(fn, "tags", None)
    if tags is None and hasattr(fn, "overloads"):
        tags = [t for o in fn.overloads() for t in getattr(fn, o).tags]
    return torch.Tag.nondeterministic_seeded in (tags or ())


@dataclass
class Snapshot:
    """A call's arguments as they were before it ran (those it may write, copied) and the
    random generators' states then."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    writable: bool  # copies were taken (every tensor, or the schema's written ones)
    rng: list[tuple[Any, Any]]

    def fresh(self, last: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Arguments for a re-run: copies again, except for the ``last`` one."""
        if last or not self.writable:
            return self.args, self.kwargs
        return _copied((self.args, self.kwargs), lambda _: True)


def _copied(obj: Any, which: Any) -> Any:
    torch = sys.modules["torch"]
    from torch.utils._pytree import tree_map_only

    with torch.no_grad():
        return tree_map_only(
            torch.Tensor, lambda t: t.detach().clone() if which(t) else t.detach(), obj
        )


def _written(fn: Any) -> set[str] | None:
    """Names of the arguments a torch op's schema says it writes; None where unknown."""
    schema = schema_of(fn)
    if schema is None:
        return None
    return {str(a.name) for a in schema.arguments if a.alias_info and a.alias_info.is_write}


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """gpucheck's own work around a call: aside (:func:`op_watch.aside
    <gpucheck.detectors.op_watch.aside>`), unseen by the case's torch-function and dispatch
    modes (a logging mode, ``opcheck``'s checks are there for the case's ops)."""
    torch = sys.modules["torch"]
    from torch.utils._python_dispatch import _disable_current_modes

    with op_watch.aside(), torch._C.DisableTorchFunction(), _disable_current_modes():
        yield


def snapshot(call: op_watch.Call) -> Snapshot:
    """Before a call: copies of the tensors it may write (every tensor argument of a function
    that does not say), and the random generators' states."""
    with alone():
        return _snapshot(call)


def _snapshot(call: op_watch.Call) -> Snapshot:
    written = _written(call.fn)
    if written == set():
        args, kwargs, copied = call.args, call.kwargs, False
    elif written is None:
        args, kwargs = _copied((call.args, call.kwargs), lambda _: True)
        copied = True
    else:
        names = argument_names(call.fn)
        ids = {id(a) for n, a in zip(names, call.args, strict=False) if n in written}
        ids |= {id(v) for k, v in call.kwargs.items() if k in written}
        args, kwargs = _copied((call.args, call.kwargs), lambda t: id(t) in ids)
        copied = True
    return Snapshot(tuple(args), dict(kwargs), copied, _rng_states(call.inputs))


def _rng_states(tensors: list[Any]) -> list[tuple[Any, Any]]:
    torch = sys.modules["torch"]
    states: list[tuple[Any, Any]] = [(None, torch.get_rng_state())]
    for device in {t.device for t in tensors if t.device.type == "cuda"}:
        states.append((device, torch.cuda.get_rng_state(device)))
    return states


def _set_rng(states: list[tuple[Any, Any]]) -> None:
    torch = sys.modules["torch"]
    for device, state in states:
        if device is None:
            torch.set_rng_state(state)
        else:
            torch.cuda.set_rng_state(state, device)


_MODE: list[Any] = []


def _fill_mode() -> Any:
    """The dispatch mode that fills fresh allocations, or tells them (made once: torch is
    imported late)."""
    if _MODE:
        return _MODE[0]
    torch = sys.modules["torch"]
    from torch.utils._python_dispatch import TorchDispatchMode

    class FillMode(TorchDispatchMode):
        def __init__(self, byte: int | None, keyset: Any, seen: Any = None) -> None:
            super().__init__()
            self.byte, self.keyset, self.seen = byte, keyset, seen

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "namespace", "aten") not in op_watch.TORCH_NAMESPACES:
            with FillMode(self.byte, self.keyset, self.seen):  # an extension op: its kernel
                return func.redispatch(self.keyset, *args, **kwargs)
        name = func.overloadpacket._qualified_op_name
        before = args[0].untyped_storage().nbytes() if name == RESIZE else 0
        out = func(*args, **kwargs)
        if name in ALLOCATIONS or (name == RESIZE and out.untyped_storage().nbytes() > before):
            if self.byte is not None:
                fill(out, self.byte, before)
            if self.seen is not None:
                self.seen(out)
        return out

    # Set after the class is made: torch wraps a mode's own __torch_dispatch__ in dynamo's
    # disable, whose first use imports torch._dynamo (4 s, once per worker: most of what the
    # probe cost on the bundled suites). Where a case loaded dynamo already, the wrap is kept.
    loaded = "torch._dynamo" in sys.modules
    FillMode.__torch_dispatch__ = (  # type: ignore[method-assign]
        torch._disable_dynamo(dispatch, recursive=True) if loaded else dispatch
    )
    _MODE.append(FillMode)
    return FillMode


def fill(t: Any, byte: int, start: int = 0) -> None:
    """Every byte of ``t``'s storage from byte ``start`` on set to ``byte`` (whatever its
    strides: the storage as one row of elements, viewed as bytes)."""
    torch = sys.modules["torch"]
    if not isinstance(t, torch.Tensor) or t.is_sparse or t.is_quantized:
        return
    size = t.element_size()
    count = t.untyped_storage().nbytes() // size
    if count:
        t.as_strided((count,), (1,), 0).view(torch.uint8)[start:].fill_(byte)


def filling(byte: int, device: Any) -> Any:
    """A context in which every fresh allocation of the calls made (an extension op's inside
    its kernel for ``device`` too) is filled with ``byte`` (the probe's mode)."""
    return _fill_mode()(byte, _keyset(device))


def allocating(seen: Any, device: Any) -> Any:
    """A context in which ``seen(tensor)`` is called with every fresh allocation of the calls
    made (an extension op's inside its kernel for ``device`` too), left as they are."""
    return _fill_mode()(None, _keyset(device), seen)


def _keyset(device: Any) -> Any:
    torch = sys.modules["torch"]
    key = torch._C.DispatchKey.CUDA if device.type == "cuda" else torch._C.DispatchKey.CPU
    return torch._C.DispatchKeySet(key)


def _bits(t: Any) -> Any:
    """The elements' bits as integers of their width, the tensor's shape (None: no such
    integer type)."""
    torch = sys.modules["torch"]
    kind = _INT.get(t.element_size())
    if kind is None or t.is_complex():
        return None
    return t.detach().view(getattr(torch, kind))


def _filled(bits: Any, byte: int) -> Any:
    """Where ``bits`` hold ``byte`` in every byte."""
    size = bits.element_size()
    value = int.from_bytes(bytes([byte]) * size, "little", signed=size > 1)
    return bits == value


def unwritten(first: Any, second: Any) -> Any:
    """Where the first re-run's output holds the first pattern and the second's the second:
    the call never wrote there (None: no bitwise view of this dtype)."""
    a, b = _bits(first), _bits(second)
    if a is None or b is None:
        return None
    return _filled(a, PATTERNS[0]) & _filled(b, PATTERNS[1])


def _judged(t: Any, inputs: set[int]) -> bool:
    """An output the probe judges: real, with elements, not byte scratch, not an argument."""
    torch = sys.modules["torch"]
    return (
        real(t)
        and not op_watch.placeholder(t)
        and t.dtype != torch.uint8
        and t.untyped_storage().data_ptr() not in inputs
    )


def _marker_dtype(t: Any) -> bool:
    return not (t.is_floating_point() or t.is_complex())


def probe(call: op_watch.Call, out: Any, snap: Snapshot) -> Evidence:
    """Re-run ``call`` twice (see the module text) and compare; the evidence of its outputs'
    unwritten elements. Records what it found in :data:`MEMORY`."""
    try:
        with alone():
            return _probe(call, out, snap)
    except Exception as err:  # a comparison that failed (memory): this call is not judged
        MEMORY.states[signature(call)] = FAILED
        return Evidence(call.op, problem=f"{type(err).__name__}: {str(err)[:200]}")


def _probe(call: op_watch.Call, out: Any, snap: Snapshot) -> Evidence:
    outs = call.outputs(out)
    inputs = {t.untyped_storage().data_ptr() for t in call.inputs}
    judged = [i for i, t in enumerate(outs) if _judged(t, inputs)]
    key = signature(call)
    if not judged:
        MEMORY.states[key] = CLEAN
        return Evidence(call.op)
    try:
        runs = _rerun(call, snap, outs)
    except Exception as err:  # the op refused to run again (state it keeps, a mode it rejects)
        MEMORY.states[key] = FAILED
        return Evidence(call.op, problem=f"{type(err).__name__}: {str(err)[:200]}")
    if runs is None:
        MEMORY.states[key] = FAILED
        return Evidence(call.op, problem="its re-runs returned outputs of other shapes")
    masks = {}
    for i, t in enumerate(outs):
        if i in judged or (real(t) and _marker_dtype(t)):
            mask = unwritten(runs[0][i], runs[1][i])
            if mask is not None:
                masks[i] = mask
    names = output_names(call.fn)
    gaps = []
    for i in judged:
        mask = masks.get(i)
        count = int(mask.sum()) if mask is not None else 0
        if count:
            gaps.append(_gap(call, outs, runs[0], masks, i, count, names))
    remember(call, key, gaps)
    return Evidence(call.op, gaps)


def _rerun(call: op_watch.Call, snap: Snapshot, outs: list[Any]) -> list[list[Any]] | None:
    torch = sys.modules["torch"]
    fn = getattr(call.fn, op_watch.ORIGINAL, call.fn)
    device = next((t.device for t in call.inputs if t.device.type == "cuda"), None)
    device = device or call.inputs[0].device
    after = _rng_states(call.inputs)
    runs = []
    try:
        for n, byte in enumerate(PATTERNS):
            args, kwargs = snap.fresh(last=n == len(PATTERNS) - 1)
            _set_rng(snap.rng)
            with torch.no_grad(), filling(byte, device):
                runs.append(op_watch.tensors(fn(*args, **kwargs)))
    finally:
        _set_rng(after)
    same = all(
        len(r) == len(outs)
        and all(a.shape == b.shape and a.dtype == b.dtype for a, b in zip(r, outs, strict=True))
        for r in runs
    )
    return runs if same else None


def _gap(
    call: op_watch.Call,
    outs: list[Any],
    run: list[Any],
    masks: dict[int, Any],
    i: int,
    count: int,
    names: list[str],
) -> Gap:
    mask, t = masks[i], outs[i]
    name = names[i] if i < len(names) and names[i] else None
    gap = Gap(
        i,
        name,
        tuple(t.shape),
        str(t.dtype).removeprefix("torch."),
        count,
        t.numel(),
        describe(mask),
        samples(t, mask),
        declared=declared(call.op, i, name),
        mask=mask,
    )
    candidates = [
        j
        for j, m in masks.items()
        if j != i and _marker_dtype(run[j]) and run[j].numel() and not bool(m.any())
    ]
    for j in candidates:
        found = marker(run[j], mask)
        if found is not None:
            dims, invalid, rows = found
            mname = names[j] if j < len(names) and names[j] else None
            gap.convention = Convention(j, mname, dims)
            gap.invalid_rows, gap.rows = invalid, rows
            break
    return gap
