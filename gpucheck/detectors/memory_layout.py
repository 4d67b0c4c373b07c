"""memory-layout: an extension call whose result depends on how its tensor arguments lie in
memory, not only on their values: a kernel that indexes a tensor as if it were contiguous.

A fused SSIM loss saves its input image for the backward and hands its pointer to a kernel:
given a permuted image (``hwc.permute(2, 0, 1)``, a slice, a channels-last batch) the forward
copies it, the backward does not, and the gradient is silently wrong. Nothing raises; the
user's gradient test fails without a word about why, or passes on the contiguous inputs it
happens to use.

The rule. For the first call per (op, argument signature: dtypes, ranks, layouts, the tails
of the shapes) of a case that has a tensor argument of two or more dimensions and more than one
element, where the process has not re-run that signature yet on :data:`~gpucheck.detectors.
budget.SHAPES` shapes (:func:`family`; every call of one found reading a layout wrongly is,
once a case: :mod:`~gpucheck.detectors.budget`), the call is
made once more, *outside the case's result* (its own copies of the arguments the call may
write, no autograd recording, the case's torch-function and dispatch modes and the random
number generators' states left as they were, not watched by the other per-call checks),
with every such argument holding the same values in another layout
(:func:`gpucheck.detectors.layouts.other_layout`: contiguous where the case passed it
non-contiguous, channels-last where 4-D, else stored with two dimensions swapped; each at a
storage offset), and its outputs are compared with those of the case's own call
(:func:`~gpucheck.detectors.layouts.compare`: integers exactly, floats within the rounding of
their dtype). A difference is bisected, one argument at a time; a call the extension refuses
with an error of its own (``TORCH_CHECK(x.is_contiguous())``) is fine, and then each argument
is tried alone. An argument that gives other results is an ``error`` naming the op, the
argument (its name where the schema or the pybind11 signature gives one), the layout and how
far off (elements, largest absolute and relative error); a CUDA error in the re-run is one
too (the kernel read past what the other layout holds).

What the outputs are: the tensors the call returned, and the tensor arguments it wrote (a
``torch.ops`` schema's mutable arguments, or, for a pybind11 function, those whose bits
changed). Left out: byte scratch (``uint8``, :func:`gpucheck.detectors.numerics.scratch`),
placeholders (no elements), elements not finite in either call, and elements the call leaves
unwritten or computes differently each time: when the outputs differ, the call is made again
in the case's layout (and in the other layout again), each time with torch's deterministic mode
(warnings only, kept from the case) and ``fill_uninitialized_memory`` on, so that what it never
writes holds NaN (an integer type's largest value), not what a freed tensor left there, and
only elements on which each pair agrees are compared. Where the unwritten-output check has
said which elements a call never wrote (:data:`UNWRITTEN_NOTE`), those are left out from the
start.

Not checked: calls inside another watched call (the outer one is), calls made while a CUDA
graph is captured, ops tagged ``torch.Tag.nondeterministic_seeded``, fake or meta tensors
(``opcheck``, ``torch.compile``), calls whose tensor arguments hold more than
:data:`MAX_BYTES` (a note says how many), calls in a ``torch.distributed`` process group (an
op that runs a collective would wait for the other ranks forever), and the sanitizer passes
(compute-sanitizer judges the case's own calls there). Gradients are compared where the
backward is a call of its own: a pybind11 extension's backward function, a ``torch.ops``
backward op called by a Python autograd formula.

Cost: per process, one more call for each (op, signature) and tail pattern whose layouts
agree (a few shapes of each), plus the copies of its tensor arguments (a pybind11 function's
all, since it does not say which it writes); a refusing extension pays one call per such
argument, a difference a few more, in every case. Its seconds are counted under
``memory-layout`` in each case's ``cost_s``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gpucheck.detectors import layouts, op_watch
from gpucheck.detectors.base import CallWatcher, CaseInfo, WorkerContext, detector_error
from gpucheck.detectors.budget import Families, tails
from gpucheck.detectors.mixed_devices import argument_names
from gpucheck.detectors.numerics import scratch
from gpucheck.errors import CUDA_ERROR_MARKERS
from gpucheck.model.kinds import Kind
from gpucheck.model.results import Finding

KIND = "memory-layout"
#: tensor arguments of a call probed at most (bytes, together)
MAX_BYTES = 1 << 30
MAX_EVIDENCE = 3000
#: the key of :class:`op_watch.Call.notes` where the unwritten-output check leaves its
#: evidence of a call: an object whose ``gaps`` each have ``index`` (of a returned tensor, as
#: in ``Call.outputs``) and ``mask`` (bool, that output's shape: True where the call never
#: wrote). Read when that listener's ``after`` ran first (it comes after this one's in the
#: registry: ``after`` runs in reverse order)
UNWRITTEN_NOTE = "unwritten"
HINT = (
    "the kernel indexes the tensor as if it were contiguous: call `.contiguous()` on it in "
    "the entry point before taking its data pointer (or index it with its strides and storage "
    "offset), or refuse other layouts with `TORCH_CHECK(x.is_contiguous(), ...)`: an error "
    "is fine, a silently wrong result is not. Where the values lie elsewhere in the layout "
    "the case passed (a permuted or sliced view), the case's own result was the wrong one"
)


@dataclass
class _Arg:
    """A tensor argument of a probed call."""

    key: int | str  # its position, or its keyword
    label: str  # "argument 2 (img1)"
    value: Any  # as the case passed it
    before: Any = None  # its value before the call (a copy), where the call may write it


@dataclass
class _Probe:
    """What a probed call needs after it returned."""

    args: list[_Arg]
    written: list[int | str] = field(default_factory=list)  # keys of the arguments it wrote
    returned: list[int] = field(default_factory=list)  # indices of Call.outputs compared
    count: int = 0  # how many tensors it returned
    labels: list[str] = field(default_factory=list)  # of the outputs compared, in order
    base: list[Any] = field(default_factory=list)  # the case's outputs, in that order
    keep: list[Any] = field(default_factory=list)  # per output: elements compared (or None)
    stable: bool = False  # keep holds where a second call in the case's layout agreed
    excluded: int = 0  # elements left out by that
    tried: list[str] = field(default_factory=list)  # evidence lines


def candidate(t: Any) -> bool:
    """A tensor argument whose layout is varied: plain (CPU or CUDA) data of two or more
    dimensions and more than one element."""
    torch = sys.modules["torch"]
    n = t.numel()
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and not t.is_quantized
        and t.device.type in ("cpu", "cuda")
        and t.dim() >= 2
        and isinstance(n, int)
        and n > 1
    )


def _plain(t: Any) -> bool:
    torch = sys.modules["torch"]
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type in ("cpu", "cuda")


def _compared(t: Any) -> bool:
    """An output that is a result: not byte scratch, not a placeholder."""
    return _plain(t) and not op_watch.placeholder(t) and not scratch(t)


def _same_bits(a: Any, b: Any) -> bool:
    torch = sys.modules["torch"]
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_complex:
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dtype == torch.bool:
        return bool(torch.equal(a, b))
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(torch.equal(a.view(ints), b.view(ints)))


def _written_keys(fn: Any) -> set[int | str] | None:
    """The arguments a ``torch.ops`` schema says the op writes (None: no schema, unknown)."""
    schema = getattr(fn, "_schema", None)
    if schema is None and hasattr(fn, "overloads"):
        schema = getattr(getattr(fn, "default", None), "_schema", None)
    if schema is None:
        return None
    out: set[int | str] = set()
    for i, a in enumerate(schema.arguments):
        info = a.alias_info
        if info is not None and info.is_write:
            out |= {i, str(a.name)}
    return out


def _seeded(fn: Any) -> bool:
    """Whether an op is tagged random (``torch.Tag.nondeterministic_seeded``)."""
    torch = sys.modules["torch"]
    tags = getattr(fn, "tags", None)
    if tags is None and hasattr(fn, "overloads"):
        tags = [t for o in fn.overloads() for t in getattr(getattr(fn, o), "tags", ())]
    return torch.Tag.nondeterministic_seeded in (tags or ())


def family(op: str, tensors: list[Any]) -> tuple[Any, ...]:
    """(op, each tensor argument's dtype, rank and layout: its dimensions from the largest
    stride down, whether at a storage offset): the calls whose re-runs in other layouts stand
    for each other but for their shapes' tails (:mod:`~gpucheck.detectors.budget`)."""
    return (op, *((str(t.dtype), t.dim(), _order(t), t.storage_offset() > 0) for t in tensors))


def _order(t: Any) -> tuple[int, ...]:
    """The dimensions of ``t`` from the largest stride down."""
    strides = t.stride()
    return tuple(sorted(range(t.dim()), key=lambda d: -strides[d]))


#: the shapes of each family re-run in other layouts in this process
FAMILIES = Families()


def _distributed() -> bool:
    torch = sys.modules["torch"]
    dist = getattr(torch, "distributed", None)
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _cuda_error(err: BaseException) -> bool:
    return any(m in str(err) for m in CUDA_ERROR_MARKERS)


@contextlib.contextmanager
def _alone() -> Iterator[None]:
    """gpucheck's own work around a call (copies, re-runs): aside (:func:`op_watch.aside`: the
    calls made there are not watched, and what they launch is not the case's), unseen by the
    case's torch-function and dispatch modes."""
    torch = sys.modules["torch"]
    with op_watch.aside(), torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
        yield


@contextlib.contextmanager
def _filled() -> Iterator[None]:
    """torch's deterministic mode around a re-run, warnings only (and kept from the case), with
    ``torch.utils.deterministic.fill_uninitialized_memory``: the re-run's fresh allocations
    (``at::empty``) hold NaN, or an integer type's largest value, where it never writes, not
    the values a freed tensor left there (the same in two runs as often as not)."""
    torch = sys.modules["torch"]
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    # the flag itself: torch.use_deterministic_algorithms also sets inductor's, whose import
    # imports torch._dynamo (seconds, once a worker), and no re-run here compiles anything
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch._C._set_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def _unwritten(call: op_watch.Call) -> dict[int, Any]:
    """Where the unwritten-output check left, for this call, which elements of each returned
    tensor it never wrote (:data:`UNWRITTEN_NOTE`): output index -> bool mask."""
    evidence = call.notes.get(UNWRITTEN_NOTE)
    return {
        int(gap.index): gap.mask
        for gap in getattr(evidence, "gaps", None) or ()
        if getattr(gap, "mask", None) is not None
    }


#: a call whose result depends on its arguments' layout (gives wrong values: before a launch
#: on the legacy stream)
MEMORY_LAYOUT = Kind(KIND, precedence=90)


class MemoryLayout(CallWatcher):
    """Re-runs the first call per (op, argument signature) of a case in other layouts, within
    the process's budget (:data:`FAMILIES`)."""

    name = KIND
    kinds = (MEMORY_LAYOUT,)
    touches_gpu = False  # its findings are made after each call; the case end reads nothing

    def __init__(self) -> None:
        self.watching = False
        self.off = False  # a sanitizer pass
        self.lock = threading.Lock()
        self.case: CaseInfo | None = None
        self.seen: set[tuple[Any, ...]] = set()
        self.found: dict[str, Finding] = {}  # op -> its finding
        self.too_big = 0

    def bind(self, worker: WorkerContext) -> None:
        self.off = worker.sanitizer is not None

    # -- op_watch listener ------------------------------------------------------------------
    def before(self, call: op_watch.Call) -> None:
        if call.depth or call.op in self.found:
            return
        tensors = call.inputs
        if not any(candidate(t) for t in tensors) or not all(_plain(t) for t in tensors):
            return
        key = (family(call.op, tensors), tails(tensors))
        with self.lock:
            if key in self.seen:
                return
            self.seen.add(key)
            if not FAMILIES.take(*key):
                return
        if op_watch.capturing() or _seeded(call.fn) or _distributed():
            return
        if sum(t.numel() * t.element_size() for t in tensors) > MAX_BYTES:
            self.too_big += 1
            return
        call.notes[KIND] = self._snapshot(call)

    def _snapshot(self, call: op_watch.Call) -> _Probe:
        """The call's tensor arguments, with copies of those it may write."""
        torch = sys.modules["torch"]
        names = argument_names(call.fn)
        writes = _written_keys(call.fn)
        keyed: list[tuple[int | str, Any]] = [*enumerate(call.args), *call.kwargs.items()]
        args = []
        with _alone(), torch.no_grad():
            for key, value in keyed:
                if not isinstance(value, torch.Tensor):
                    continue
                name = names[key] if isinstance(key, int) and key < len(names) else ""
                label = f"argument {key}" + (f" ({name})" if name else "")
                may_write = writes is None or key in writes
                before = value.detach().clone() if may_write and _plain(value) else None
                args.append(_Arg(key, label, value, before))
        return _Probe(args)

    def after(self, call: op_watch.Call, out: Any) -> None:
        probe = call.notes.pop(KIND, None)
        if probe is None or call.error is not None:
            return
        torch = sys.modules["torch"]
        with (
            _alone(),
            torch.no_grad(),
            torch.random.fork_rng(devices=self._devices(probe), device_type="cuda"),
        ):
            try:
                found = self._judge(call, out, probe)
            except torch.OutOfMemoryError:
                self.too_big += 1
                return
        if found is not None:
            FAMILIES.bug(family(call.op, call.inputs))
            with self.lock:
                self.found.setdefault(call.op, found)

    @staticmethod
    def _devices(probe: _Probe) -> list[int]:
        return sorted({int(a.value.device.index) for a in probe.args if a.value.is_cuda})

    # -- the judgement ----------------------------------------------------------------------
    def _judge(self, call: op_watch.Call, out: Any, probe: _Probe) -> Finding | None:
        """The call's outputs in the case's layouts against other layouts (see the module
        text); a finding, or None."""
        if not self._outputs(call, out, probe):
            return None
        cands = [a for a in probe.args if candidate(a.value)]
        first, err = self._differs(call, probe, {a.key: self._other(a) for a in cands})
        if err is not None and _cuda_error(err):
            return self._fault(call, probe, cands, err)
        if err is None and not first:
            return None
        if len(cands) == 1:
            if err is not None:
                return None  # refused: the extension's check did the job
            return self._finding(call, probe, [(self._phrase(call, probe, cands[0]), first)])
        if err is not None:
            probe.tried.append(f"all together: refused ({_short(err)})")
        bad = []
        for a in cands:
            gaps, err = self._differs(call, probe, {a.key: self._other(a)})
            if err is not None and _cuda_error(err):
                return self._fault(call, probe, [a], err)
            if err is not None:
                probe.tried.append(f"{a.label} alone: refused ({_short(err)})")
            elif gaps:
                bad.append((self._phrase(call, probe, a), gaps))
        if not bad and first:  # only together
            together = ", ".join(
                f"{a.label} {layouts.other_layout(self._source(a))[1]}" for a in cands
            )
            bad = [(f"together: {together}", first)]
        return self._finding(call, probe, bad) if bad else None

    def _outputs(self, call: op_watch.Call, out: Any, probe: _Probe) -> bool:
        """Fill in what the case's call gave (outputs compared, arguments written)."""
        returned = call.outputs(out)
        probe.count = len(returned)
        args = {id(a.value) for a in probe.args}
        unwritten = _unwritten(call)
        for i, t in enumerate(returned):
            if _compared(t) and id(t) not in args:
                probe.returned.append(i)
                probe.labels.append(f"output {i}")
                probe.base.append(t.detach())
                mask = unwritten.get(i)
                probe.keep.append(None if mask is None else ~mask)
        for a in probe.args:
            if a.before is not None and _compared(a.value) and not _same_bits(a.before, a.value):
                probe.written.append(a.key)
                probe.labels.append(f"{a.label}, written by the call")
                probe.base.append(a.value.detach())
                probe.keep.append(None)
        return bool(probe.base)

    @staticmethod
    def _source(a: _Arg) -> Any:
        """The argument's value before the call."""
        return a.before if a.before is not None else a.value

    def _other(self, a: _Arg) -> Any:
        return lambda: layouts.other_layout(self._source(a))

    def _run(
        self,
        call: op_watch.Call,
        probe: _Probe,
        given: dict[int | str, Any],
        filled: bool = False,
    ) -> list[Any]:
        """The call made again: ``given`` arguments (key -> a tensor-making function) in other
        layouts, the others as before the call (``filled``: its fresh memory filled,
        :func:`_filled`); returns its outputs, as the probe's base."""
        args, kwargs = list(call.args), dict(call.kwargs)
        passed: dict[int | str, Any] = {}
        for a in probe.args:
            if a.key in given:
                value = given[a.key]()[0]
            elif a.before is not None:
                value = a.before.clone()
            else:
                value = a.value
            passed[a.key] = value
            if isinstance(a.key, int):
                args[a.key] = value
            else:
                kwargs[a.key] = value
        with _filled() if filled else contextlib.nullcontext():
            out = call.fn(*args, **kwargs)  # aside (see after): not watched
        returned = op_watch.tensors(out)
        if len(returned) != probe.count:
            raise _Shape(f"it returned {len(returned)} tensors instead of {probe.count}")
        return [returned[i] for i in probe.returned] + [passed[k] for k in probe.written]

    def _gaps(self, probe: _Probe, outs: list[Any], keep: list[Any]) -> list[layouts.Gap]:
        return [
            layouts.compare(label, b, o, k)
            for label, b, o, k in zip(probe.labels, probe.base, outs, keep, strict=True)
        ]

    def _stabilize(self, call: op_watch.Call, probe: _Probe) -> None:
        """Leave out the elements on which the call made again in the case's own layout, its
        fresh memory filled, disagrees with the case's call (what it never writes holds NaN
        there, and whatever the memory held in the case's call)."""
        if probe.stable:
            return
        probe.stable = True
        outs = self._run(call, probe, {}, filled=True)
        for i, (b, o) in enumerate(zip(probe.base, outs, strict=True)):
            odd = layouts.disagree(b, o)
            if odd is None:
                continue
            keep = probe.keep[i]
            now = ~odd if keep is None else keep & ~odd
            probe.excluded += int((keep.sum() if keep is not None else b.numel()) - now.sum())
            probe.keep[i] = now

    def _differs(
        self, call: op_watch.Call, probe: _Probe, given: dict[int | str, Any]
    ) -> tuple[list[layouts.Gap], BaseException | None]:
        """The outputs that differ beyond what the call's own repeats differ by, when the
        ``given`` arguments are laid out otherwise; or the error the call raised."""
        try:
            outs = self._run(call, probe, given)
        except _Shape as err:
            return [layouts.Gap(probe.labels[0], 0, 1, 0.0, 0.0, 0.0, note=str(err))], None
        except Exception as err:
            return [], err
        gaps = [g for g in self._gaps(probe, outs, probe.keep) if g.differing]
        if not gaps:
            return [], None
        try:
            self._stabilize(call, probe)
            again = self._run(call, probe, given, filled=True)
        except Exception:
            return [], None  # not repeatable: nothing to say
        keep = []
        for k, o, a in zip(probe.keep, outs, again, strict=True):
            odd = layouts.disagree(o, a)
            keep.append(k if odd is None else (~odd if k is None else k & ~odd))
        return [g for g in self._gaps(probe, outs, keep) if g.differing], None

    def _phrase(self, call: op_watch.Call, probe: _Probe, a: _Arg) -> str:
        """``argument 2 (img1) contiguous (strides ..., storage offset 4)``: the argument and
        the layout that gives other results; its own strides at an offset where the offset
        alone does (one more call, made only for a finding)."""
        source = self._source(a)
        gaps, err = self._differs(call, probe, {a.key: lambda: layouts.at_offset(source)})
        if err is None and gaps:
            return f"{a.label} in {layouts.at_offset(source)[1]}"
        return f"{a.label} {layouts.other_layout(source)[1]}"

    # -- findings ---------------------------------------------------------------------------
    @property
    def _case(self) -> CaseInfo:
        """The case under way (its findings' place; calls are watched only in one)."""
        assert self.case is not None
        return self.case

    def _finding(
        self, call: op_watch.Call, probe: _Probe, bad: list[tuple[str, list[layouts.Gap]]]
    ) -> Finding:
        lines = [f"the case's call: {self._passed(probe)}"]
        for phrase, gaps in bad:
            lines.append(f"re-run with {phrase}:")
            lines += [f"  {g.text()}" for g in gaps]
        if probe.excluded:
            lines.append(
                f"left out: {probe.excluded} element(s) on which the call, made again in the "
                "case's own layout, disagreed with itself (unwritten, or not deterministic)"
            )
        lines += probe.tried
        where = f" (called from {call.frame})" if call.frame else ""
        worst = bad[0][1][0]
        how = worst.note or (
            f"{worst.differing} of {worst.compared} elements differ, largest absolute error "
            f"{worst.max_abs:.3g}"
        )
        return self._case.finding(
            KIND,
            "error",
            f"{call.op} gives other results for the same values in another memory "
            f"layout: {'; '.join(p for p, _ in bad)} ({worst.label}: {how}){where}",
            op=call.op,
            evidence="\n".join(lines)[:MAX_EVIDENCE],
            hint=HINT,
        )

    def _fault(
        self, call: op_watch.Call, probe: _Probe, args: list[_Arg], err: BaseException
    ) -> Finding:
        where = f" (called from {call.frame})" if call.frame else ""
        which = ", ".join(f"{a.label} {layouts.other_layout(self._source(a))[1]}" for a in args)
        return self._case.finding(
            KIND,
            "error",
            f"{call.op} failed with a CUDA error when given the same values in another "
            f"memory layout: {which}{where}",
            op=call.op,
            evidence=f"the case's call: {self._passed(probe)}\nthe re-run's error: {err}"[
                :MAX_EVIDENCE
            ],
            hint=HINT,
        )

    @staticmethod
    def _passed(probe: _Probe) -> str:
        return "; ".join(
            f"{a.label} {layouts.describe(a.value)}" for a in probe.args if candidate(a.value)
        )

    # -- the case ---------------------------------------------------------------------------
    def case_started(self, case: CaseInfo) -> None:
        self.case, self.seen, self.found, self.too_big = case, set(), {}, 0
        if not self.off:
            self.start_watching()

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        if not self.stop_watching():
            return []
        found = list(self.found.values())
        if self.too_big:
            found.append(
                detector_error(
                    self.name,
                    f"did not re-run {self.too_big} call(s) in other layouts: their tensor "
                    f"arguments hold more than {MAX_BYTES >> 20} MiB, or the re-run ran out "
                    "of memory",
                    case,
                    severity="info",
                )
            )
        self.found = {}
        return found


class _Shape(Exception):
    """The re-run returned another number of tensors."""


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".splitlines()[0]
    return text[:200]
