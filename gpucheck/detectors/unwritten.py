"""Unwritten outputs: the elements of an extension call's outputs that the call never wrote.

Shared evidence, not a detector: :mod:`~gpucheck.detectors.unwritten_output` makes findings of
it, :mod:`~gpucheck.detectors.numerics` leaves what it shows out of its fingerprints, and the
sanitizer passes' tracing (:mod:`~gpucheck.detectors.sanitizer_trace`) asks its rule whether a
read of never-written memory is a convention's.

**The probe.** A call is run twice more, outside the case's result (:func:`op_watch.aside
<gpucheck.detectors.op_watch.aside>`: no listener sees the re-runs; ``torch.no_grad``; on
copies of the arguments the call may write, taken before it ran; the random generators set
back to where they stood before the call, then to where the call left them), under a
``TorchDispatchMode`` that fills every fresh allocation the call makes (``at::empty``,
``empty_strided``, ``empty_like``, ``new_empty``, a ``resize_`` that grows) with a byte
pattern: ``0xA5`` in the first re-run, ``0x5A`` in the second. A pybind11 function's
``at::empty`` reaches the mode through the dispatcher; for a ``torch.ops`` op the mode sees
the op, and enters it again (``redispatch`` to its device's kernel) with a mode of its own
inside, which sees the op's allocations. An element is **unwritten** when it holds the first
pattern (bitwise) after the first re-run and the second pattern after the second: a value the
call computed is the same in both runs, so it cannot be both. Not judged: ``uint8`` outputs
(byte scratch, partly unwritten by design: :func:`~gpucheck.detectors.numerics.scratch`),
placeholders, outputs that are an argument returned as is, tensors without memory (fake,
meta), calls that raised, random ``torch.ops`` (``nondeterministic_seeded``), calls under
CUDA-graph capture. A re-run that raises, or whose outputs differ in number, shape or dtype
from the call's, gives no finding (the detector notes once per op that the probe could not
run).

**Design or bug, from evidence (:func:`marker`).** The unwritten elements of an output are
the extension's convention when another output of the same call is an integer or bool tensor
(a count, a radius, a mask), itself written everywhere, that shares the output's leading
dimension(s) and is 0 (False) in every row (of those dimensions) holding an unwritten
element: the 3DGS projection leaves the entries of culled Gaussians unwritten where their
radius is 0. Otherwise they are a bug. An author can also declare an output unwritten by
design: ``GPUCHECK_UNWRITTEN=op:output,...`` (:data:`UNWRITTEN_ENV`; the op as gpucheck names
it, the output by index or by name, all outputs when left out).

**Memory.** Per worker process: a signature (op, dtypes, shapes) is probed on its first call
where its family (op, dtypes, ranks, placeholders) has not been probed on a shape of its tail
pattern yet (:func:`wanted`: at most a few shapes a family, :mod:`~gpucheck.detectors.budget`);
one found leaving outputs unwritten by mistake is probed again on later calls, and its family
on every shape (the detector's budget); a convention, once found for an (op, output), is kept
for the process and applied to every later call of the op whose marker fits
(:func:`left_out`).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gpucheck.detectors import op_watch
from gpucheck.detectors.budget import Families, tails
from gpucheck.detectors.element_sets import describe, samples
from gpucheck.detectors.mixed_devices import argument_names, split_params

#: the bytes the two re-runs fill fresh allocations with (neither 0: an unwritten integer
#: marker never reads 0)
PATTERNS = (0xA5, 0x5A)
#: outputs unwritten by design, named by their author: ``op[:output],...``
UNWRITTEN_ENV = "GPUCHECK_UNWRITTEN"
#: the key of a call's :class:`Evidence` in ``Call.notes``
NOTE = "unwritten"
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
KIND = "unwritten-output"
HINT = (
    "write every element the output holds: allocate it with `at::zeros` (or `.zero_()` / "
    "`.fill_()`) where the kernel may skip elements, or write the skipped ones; if leaving "
    "them is by design, return a marker (an integer or bool output of the same leading "
    "dimension that is 0 exactly in the rows left unwritten) or declare the output: "
    "GPUCHECK_UNWRITTEN=OP:OUTPUT"
)
CONVENTION_HINT = (
    "nothing to do: readers must skip the rows the marker marks invalid; gpucheck leaves them "
    "out of its comparisons (numerics) and of the sanitizer's uninitialized reads"
)
RESIZE = "aten::resize_"
_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


@dataclass(frozen=True)
class Convention:
    """Output ``marker`` (an integer or bool output of the same call) marks the rows of its
    first ``dims`` dimensions that an output leaves unwritten: 0 there."""

    marker: int
    marker_name: str | None
    dims: int

    @property
    def label(self) -> str:
        return label(self.marker, self.marker_name)


@dataclass
class Gap:
    """The unwritten elements of one output of one call."""

    index: int
    name: str | None
    shape: tuple[int, ...]
    dtype: str
    count: int
    numel: int
    where: str  # "whole rows: 2 of 6 rows along dim 0 (1, 3)", "16 of 64 tiles of 16×16", ...
    samples: list[str]  # values the case's own call left there
    convention: Convention | None = None
    invalid_rows: int = 0  # rows the marker marks invalid (a convention's)
    rows: int = 0  # rows of the marker's dimensions
    declared: bool = False  # named in GPUCHECK_UNWRITTEN
    mask: Any = field(default=None, repr=False)  # bool, the output's shape: this call's gap

    @property
    def label(self) -> str:
        return label(self.index, self.name)

    @property
    def by_design(self) -> bool:
        return self.convention is not None or self.declared


@dataclass
class Evidence:
    """What the probe of one call found: the outputs with unwritten elements, or why it could
    not look (``problem``, a sentence)."""

    op: str
    gaps: list[Gap] = field(default_factory=list)
    problem: str | None = None

    @property
    def bugs(self) -> list[Gap]:
        return [g for g in self.gaps if not g.by_design]


def label(index: int, name: str | None) -> str:
    """``output 1 (alpha)``, ``output 0``."""
    return f"output {index}" + (f" ({name})" if name else "")


# -- process memory -----------------------------------------------------------------------

CLEAN, UNWRITTEN, BY_DESIGN, FAILED = "clean", "unwritten", "by design", "failed"


@dataclass
class Memory:
    """What the probes of this process found, by call signature, the conventions by op, and
    the shapes of each family of signatures probed (:mod:`~gpucheck.detectors.budget`)."""

    states: dict[tuple[Any, ...], str] = field(default_factory=dict)
    conventions: dict[str, dict[int, Convention]] = field(default_factory=dict)
    shapes: Families = field(default_factory=Families)

    def clear(self) -> None:
        self.states.clear()
        self.conventions.clear()
        self.shapes.clear()


MEMORY = Memory()


def signature(call: op_watch.Call) -> tuple[Any, ...]:
    """(op, each tensor argument's dtype, shape and device type, each bool argument): what one
    probe stands for."""
    flags = tuple(a for a in (*call.args, *call.kwargs.values()) if isinstance(a, bool))
    return (
        call.op,
        tuple((str(t.dtype), tuple(t.shape), t.device.type) for t in call.inputs),
        flags,
    )


def family(call: op_watch.Call) -> tuple[Any, ...]:
    """(op, each tensor argument's dtype, rank, device type and whether it is a placeholder,
    each bool argument): the signatures whose probes stand for each other but for their
    shapes' tails (:mod:`~gpucheck.detectors.budget`)."""
    flags = tuple(a for a in (*call.args, *call.kwargs.values()) if isinstance(a, bool))
    return (
        call.op,
        tuple((str(t.dtype), t.dim(), t.device.type, op_watch.placeholder(t)) for t in call.inputs),
        flags,
    )


def wanted(call: op_watch.Call) -> bool:
    """Whether a call of a signature not probed yet is probed: the first shapes of each tail
    pattern of its family, every shape of a family found leaving outputs unwritten by
    mistake (:class:`~gpucheck.detectors.budget.Families`)."""
    return MEMORY.shapes.take(family(call), tails(call.inputs))


def conventions(op: str) -> dict[int, Convention]:
    """The conventions this process found for ``op``'s outputs, by output index."""
    return MEMORY.conventions.get(op, {})


# -- names -------------------------------------------------------------------------------


def output_names(fn: Any) -> list[str]:
    """The names of a watched callable's outputs where it tells them: a torch op schema's
    return names, or a line of a pybind11 function's docstring that names them
    (``f(x) -> tuple[color: Tensor, radii: Tensor]``, or ``-> (Tensor color, Tensor radii)``);
    "" where unnamed."""
    schema = _schema(fn)
    if schema is not None:
        return [str(r.name or "") for r in schema.returns]
    for line in (getattr(fn, "__doc__", None) or "").splitlines():
        left, arrow, returns = line.rpartition("->")
        names = _return_names(returns.strip()) if arrow and "(" in left else []
        if any(names):
            return names
    return []


def _return_names(text: str) -> list[str]:
    for opener, closer in (("tuple[", "]"), ("Tuple[", "]"), ("(", ")")):
        if text.startswith(opener) and text.endswith(closer):
            text = text[len(opener) : -len(closer)]
            break
    names = []
    for part in split_params(text):
        part = part.strip()
        if ":" in part:  # "color: Tensor"
            name = part.split(":")[0].strip()
        else:  # "Tensor color"
            name = part.split()[-1] if " " in part else ""
        names.append(name if name.isidentifier() else "")
    return names


def _schema(fn: Any) -> Any:
    """A torch op's schema (an overload packet's when it has one overload only), or None."""
    schema = getattr(fn, "_schema", None)
    if schema is None and hasattr(fn, "overloads") and list(fn.overloads()) == ["default"]:
        schema = getattr(fn.default, "_schema", None)
    return schema


def declared(op: str, index: int, name: str | None, text: str | None = None) -> bool:
    """Whether ``GPUCHECK_UNWRITTEN`` (or ``text``) names this output of ``op`` as unwritten
    by design: ``op`` (all its outputs), ``op:INDEX`` or ``op:NAME``; a ``torch.ops`` op as
    ``namespace::name``, a pybind11 function as ``package._C.function``."""
    raw = os.environ.get(UNWRITTEN_ENV) if text is None else text
    for item in (x.strip() for x in (raw or "").split(",")):
        if "::" in item:
            ns, _, rest = item.partition("::")
            base, sep, which = rest.partition(":")
            base = f"{ns}::{base}"
        else:
            base, sep, which = item.partition(":")
        if base.split(".")[-1] == "default" and "::" in base:
            base = base.rsplit(".", 1)[0]
        if base != op:
            continue
        if not sep or which == str(index) or (name and which == name):
            return True
    return False


# -- the probe ---------------------------------------------------------------------------


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
    schema = _schema(fn)
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
    _remember(call, key, gaps)
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


def _remember(call: op_watch.Call, key: tuple[Any, ...], gaps: list[Gap]) -> None:
    op = call.op
    if any(not g.by_design for g in gaps):
        MEMORY.states[key] = UNWRITTEN
        MEMORY.shapes.bug(family(call))
    else:
        MEMORY.states[key] = BY_DESIGN if gaps else CLEAN
    for g in gaps:
        if g.convention is not None:
            MEMORY.conventions.setdefault(op, {})[g.index] = g.convention


# -- the rule ----------------------------------------------------------------------------


def rows_valid(m: Any, dims: int) -> Any:
    """Per row of ``m``'s first ``dims`` dimensions: whether any of its values is non-zero."""
    rows = math.prod(m.shape[:dims])
    return (m.reshape(rows, -1) != 0).any(1)


def marker(m: Any, mask: Any) -> tuple[int, int, int] | None:
    """(dims, invalid rows, rows) when ``m`` (an integer or bool output) shares ``mask``'s
    first ``dims`` dimensions and is 0 in every row of them holding an unwritten element; the
    fewest dimensions that do; None when none do."""
    for dims in range(1, min(m.dim(), mask.dim()) + 1):
        if tuple(m.shape[:dims]) != tuple(mask.shape[:dims]):
            return None
        valid = rows_valid(m, dims)
        gaps = mask.reshape(valid.numel(), -1).any(1)
        if not bool((gaps & valid).any()):
            return dims, int((~valid).sum()), valid.numel()
    return None


def invalid_rows(m: Any, shape: tuple[int, ...], dims: int) -> Any:
    """Where marker ``m`` marks rows of an output of ``shape`` invalid: bool, shaped to
    broadcast over the output (None: the marker does not fit this output)."""
    if m.dim() < dims or len(shape) < dims or tuple(m.shape[:dims]) != tuple(shape[:dims]):
        return None
    invalid = ~rows_valid(m, dims)
    return invalid.reshape(*shape[:dims], *([1] * (len(shape) - dims)))


def left_out(op: str, outs: list[Any], fn: Any = None) -> dict[int, Any]:
    """For a call of ``op`` (the callable ``fn``) with outputs ``outs``: by output index, the
    elements a comparison of results leaves out: those of each convention output that its
    marker marks invalid in this call, and all of an output declared in
    ``GPUCHECK_UNWRITTEN``."""
    found = {}
    for i, conv in conventions(op).items():
        if i < len(outs) and conv.marker < len(outs):
            mask = invalid_rows(outs[conv.marker], tuple(outs[i].shape), conv.dims)
            if mask is not None:
                found[i] = mask
    if os.environ.get(UNWRITTEN_ENV):
        torch = sys.modules["torch"]
        names = output_names(fn)
        for i, t in enumerate(outs):
            if declared(op, i, names[i] if i < len(names) and names[i] else None):
                found[i] = torch.ones((), dtype=torch.bool, device=t.device)
    return found
