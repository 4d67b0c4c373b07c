"""Unwritten outputs: the elements of an extension call's outputs that the call never wrote.

Shared evidence, not a detector: :mod:`~gpucheck.detectors.unwritten_output` makes findings of
it, :mod:`~gpucheck.detectors.numerics` leaves what it shows out of its fingerprints, and the
sanitizer passes' tracing (:mod:`~gpucheck.detectors.sanitizer_trace`) asks its rule whether a
read of never-written memory is a convention's. Three concepts, three modules:

**The probe** (:mod:`~gpucheck.detectors.unwritten_probe`). A call is run twice more, outside
the case's result, with every fresh allocation it makes (``at::empty``, ``empty_strided``,
``empty_like``, ``new_empty``, a ``resize_`` that grows) filled with a byte pattern: ``0xA5``
in the first re-run, ``0x5A`` in the second. A pybind11 function's ``at::empty`` reaches the
fill through the dispatcher; for a ``torch.ops`` op the fill enters the op again (``redispatch``
to its device's kernel) and sees its allocations. An element is **unwritten** when it holds
the first pattern (bitwise) after the first re-run and the second pattern after the second:
a value the call computed is the same in both runs, so it cannot be both. Not judged:
``uint8`` outputs (byte scratch, partly unwritten by design:
:func:`~gpucheck.detectors.numerics.scratch`), placeholders, outputs that are an argument
returned as is, tensors without memory (fake, meta), calls that raised, random ``torch.ops``
(``nondeterministic_seeded``), calls under CUDA-graph capture. A re-run that raises, or whose
outputs differ in number, shape or dtype from the call's, gives no finding (the detector notes
once per op that the probe could not run).

**Design or bug, from evidence** (:mod:`~gpucheck.detectors.unwritten_rule`). The unwritten
elements of an output are the extension's convention when another output of the same call is
an integer or bool tensor (a count, a radius, a mask), itself written everywhere, that shares
the output's leading dimension(s) and is 0 (False) in every row (of those dimensions) holding
an unwritten element: the 3DGS projection leaves the entries of culled Gaussians unwritten
where their radius is 0. Otherwise they are a bug. An author can also declare an output
unwritten by design: ``GPUCHECK_UNWRITTEN=op:output,...`` (:data:`UNWRITTEN_ENV`; the op as
gpucheck names it, the output by index or by name, all outputs when left out).

**Memory** (this module, with the evidence's types and the outputs' names). Per worker
process: a signature (op, dtypes, shapes) is probed on its first call where its family (op,
dtypes, ranks, placeholders) has not been probed on a shape of its tail pattern yet
(:func:`wanted`: at most a few shapes a family, :mod:`~gpucheck.detectors.budget`); one found
leaving outputs unwritten by mistake is probed again on later calls, and its family on every
shape (the detector's budget); a convention, once found for an (op, output), is kept for the
process and applied to every later call of the op whose marker fits
(:func:`~gpucheck.detectors.unwritten_rule.left_out`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpucheck.detectors import op_watch
from gpucheck.detectors.budget import Families, tails
from gpucheck.detectors.mixed_devices import split_params

#: outputs unwritten by design, named by their author: ``op[:output],...``
UNWRITTEN_ENV = "GPUCHECK_UNWRITTEN"
#: the key of a call's :class:`Evidence` in ``Call.notes``
NOTE = "unwritten"
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


# -- process memory ---------------------------------------------------------------------

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


def remember(call: op_watch.Call, key: tuple[Any, ...], gaps: list[Gap]) -> None:
    """What the probe of one call signature found, for the later calls of this process (a
    bug: its family probed on every shape)."""
    op = call.op
    if any(not g.by_design for g in gaps):
        MEMORY.states[key] = UNWRITTEN
        MEMORY.shapes.bug(family(call))
    else:
        MEMORY.states[key] = BY_DESIGN if gaps else CLEAN
    for g in gaps:
        if g.convention is not None:
            MEMORY.conventions.setdefault(op, {})[g.index] = g.convention


# -- names -------------------------------------------------------------------------------


def output_names(fn: Any) -> list[str]:
    """The names of a watched callable's outputs where it tells them: a torch op schema's
    return names, or a line of a pybind11 function's docstring that names them
    (``f(x) -> tuple[color: Tensor, radii: Tensor]``, or ``-> (Tensor color, Tensor radii)``);
    "" where unnamed."""
    schema = schema_of(fn)
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


def schema_of(fn: Any) -> Any:
    """A torch op's schema (an overload packet's when it has one overload only), or None."""
    schema = getattr(fn, "_schema", None)
    if schema is None and hasattr(fn, "overloads") and list(fn.overloads()) == ["default"]:
        schema = getattr(fn.default, "_schema", None)
    return schema
