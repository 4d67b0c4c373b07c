"""compute-sanitizer records traced back to the watched call that caused them (sanitizer passes).

A record names a kernel and an address; the bug is an op. In a sanitizer pass the worker
keeps this listener on :mod:`~gpucheck.detectors.op_watch` around the case body: for every
watched call it notes where the sanitizer logs ended before and after it, and where its
tensors (outputs and arguments) lie in device memory (:mod:`gpucheck.sanitizer.tracing`).
When the case's slice of the log is read (:meth:`SanitizerTrace.findings`), each record is
placed among them, and:

- an **initcheck** read whose address lies in an output of a watched call is that call's
  output read where it was never written: ``unwritten-output`` (error) naming the op, the output
  and the elements, and the reader (``read by torch's copy at test_x.py:94``). A read of the
  rows another output of that call marks invalid (0: the unwritten-output convention, see
  :mod:`gpucheck.detectors.unwritten`), or of an output declared in ``GPUCHECK_UNWRITTEN``, is
  not an error: the records are left out, and one note says how many;
- a **racecheck** hazard, written while a watched call ran, is ``data-race`` (its severity:
  error or warning) naming the op that launched the kernel; outside any call, the kernel's
  library is looked up among the process's extensions (:func:`gpucheck.detectors.ext_watch.
  locate`);
- a **memcheck** invalid access written while a watched call ran is ``out-of-bounds`` (error)
  naming the op and the kernel, and the tensor of a call the tool names as the nearest
  allocation (``193 bytes after output 0 of ...``).

The records stay ``sanitizer`` findings too (the symptoms these diagnoses explain), except a
convention's reads. Records written while gpucheck did its own work (the probe's re-runs,
numerics' hashing: :func:`op_watch.aside <gpucheck.detectors.op_watch.aside>`) are left out
altogether. Cost: in sanitizer passes only, a ``stat`` of the log per call edge and the
tensors' addresses; integer and bool outputs (markers) are kept until the case's record.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from gpucheck.detectors import ext_watch, op_watch, unwritten, unwritten_probe, unwritten_rule
from gpucheck.detectors.base import CaseInfo
from gpucheck.detectors.launch_windows import kernel_list, torch_kernel
from gpucheck.detectors.mixed_devices import argument_names, labelled_tensors
from gpucheck.model.kinds import Kind
from gpucheck.model.results import EVIDENCE_CHARS, Finding
from gpucheck.sanitizer import tracing
from gpucheck.sanitizer.findings import HINTS, record_findings
from gpucheck.sanitizer.parser import SanitizerFinding, fold

DATA_RACE = "data-race"
OUT_OF_BOUNDS = "out-of-bounds"
#: the sanitizer's records traced to the op that launched their kernel: an access out of
#: bounds (it makes the kernel fault: early in the precedence) and a shared-memory race (it
#: gives wrong values)
KINDS = (Kind(OUT_OF_BOUNDS, precedence=30), Kind(DATA_RACE, precedence=100))
#: integer/bool outputs up to this many elements are kept for the convention's rule
MAX_MARKER = 1 << 24
NOTE = "sanitizer-trace"
ACCESSES = ("read", "write", "atomic", "access")
RACE_HINT = (
    f"{HINTS['racecheck']}: put a __syncthreads() between the write and the reads of each "
    "shared-memory tile (and before the tile is overwritten), and make every thread of the "
    "block reach it"
)
OOB_HINT = (
    "the kernel indexes past the tensor it was given: check its bounds against the sizes it "
    "receives (the element count, the row stride) and the grid's tail block"
)


class SanitizerTrace:
    """Notes the case's watched calls in a sanitizer pass; traces its records to them."""

    name = NOTE  # its seconds around the calls, in a case's ``cost_s``

    def __init__(self, logs: Callable[[], list[Any]]) -> None:
        self.find_logs = logs
        self.logs: list[str] = []
        self.lock = threading.Lock()
        self.calls = tracing.Calls()
        self.markers: dict[int, dict[int, Any]] = {}  # call -> output index -> int/bool tensor
        self.open: dict[int, tracing.Aside] = {}  # thread -> its aside under way

    # -- the case ---------------------------------------------------------------------------
    def begin(self) -> None:
        """The case body starts: note its calls from now on."""
        self.logs = [str(p) for p in self.find_logs()]
        self.calls, self.markers, self.open = tracing.Calls(), {}, {}
        op_watch.add(self)
        op_watch.ASIDE_OBSERVERS.append(self.aside)

    def end(self) -> None:
        """The case body ended (what was noted is kept for :meth:`findings`)."""
        op_watch.remove(self)
        if self.aside in op_watch.ASIDE_OBSERVERS:
            op_watch.ASIDE_OBSERVERS.remove(self.aside)

    def clear(self) -> None:
        """The case's record is made: let its tensors go."""
        self.calls, self.markers, self.open = tracing.Calls(), {}, {}

    def _where(self) -> dict[str, int]:
        if not self.logs:  # the tool had not made its log when the case began
            self.logs = [str(p) for p in self.find_logs()]
        sizes = {}
        for log in self.logs:
            try:
                sizes[log] = os.stat(log).st_size
            except OSError:
                continue
        return sizes

    # -- op_watch listener and aside observer -----------------------------------------------
    def before(self, call: op_watch.Call) -> None:
        with self.lock:
            index = len(self.calls.windows)
            window = tracing.Window(index, call.op, call.frame, self._where())
            self.calls.windows.append(window)
        call.notes[NOTE] = window
        names = argument_names(call.fn)
        for label, t in labelled_tensors(call.args, call.kwargs, names):
            self._span(index, call.op, label, None, None, t)

    def after(self, call: op_watch.Call, out: Any) -> None:
        window = call.notes.get(NOTE)
        if not isinstance(window, tracing.Window):
            return
        window.end = self._where()
        if call.error is not None:
            return
        names = unwritten.output_names(call.fn)
        for i, t in enumerate(call.outputs(out)):
            name = names[i] if i < len(names) and names[i] else None
            if self._span(window.call, call.op, unwritten.label(i, name), i, name, t) and (
                not (t.is_floating_point() or t.is_complex()) and t.numel() <= MAX_MARKER
            ):
                self.markers.setdefault(window.call, {})[i] = t

    def aside(self, started: bool) -> None:
        thread = threading.get_ident()
        with self.lock:
            if started:
                self.open[thread] = tracing.Aside(self._where())
                self.calls.asides.append(self.open[thread])
            elif thread in self.open:
                self.open.pop(thread).end = self._where()

    def _span(
        self, call: int, op: str, label: str, output: int | None, name: str | None, t: Any
    ) -> bool:
        if not unwritten_probe.real(t) or op_watch.placeholder(t):
            return False  # fake or meta: no memory (a CPU tensor's address never matches)
        span = tracing.Span(
            call,
            op,
            label,
            output,
            name,
            int(t.data_ptr()),
            int(t.untyped_storage().data_ptr()),
            tuple(t.shape),
            tuple(t.stride()),
            t.element_size(),
            str(t.dtype).removeprefix("torch."),
        )
        with self.lock:
            self.calls.spans.append(span)
        return True

    # -- the records ------------------------------------------------------------------------
    def findings(
        self,
        log: str,
        start: int,
        text: str,
        tool: str | None,
        case: CaseInfo,
        other_current: bool = False,
    ) -> list[Finding]:
        """The case's records in ``text`` (``log`` from byte ``start``) as findings: those
        traced to a call (see the module text), then every record kept as it is."""
        raw: list[SanitizerFinding] = []
        reads: dict[tuple[int, int], list[tracing.Traced]] = {}
        races: dict[tuple[str, str], list[tracing.Traced]] = {}
        oob: dict[tuple[str, str], list[tracing.Traced]] = {}
        for t in tracing.trace(log, start, text, tool, self.calls):
            r = t.record
            span = t.span
            initcheck = r.tool == "initcheck" and t.element is not None
            if initcheck and span is not None and span.output is not None:
                reads.setdefault((span.call, span.output), []).append(t)
                continue
            raw.append(r)
            if r.tool == "racecheck" and r.kernel_name:
                owner = t.window.op if t.window else _library(r.kernel or r.kernel_name)
                if owner:
                    races.setdefault((owner, r.kernel_name), []).append(t)
            elif r.tool == "memcheck" and r.access in ACCESSES and t.window and r.kernel_name:
                oob.setdefault((t.window.op, r.kernel_name), []).append(t)
        found = []
        for group in reads.values():
            why = self._by_design(group)
            found.append(_read_finding(group, why, case))
            if why is None:
                raw += [t.record for t in group]
        found += [_race_finding(owner, kernel, g, case) for (owner, kernel), g in races.items()]
        found += [_oob_finding(op, kernel, g, case) for (op, kernel), g in oob.items()]
        return found + record_findings(fold(raw), case.device, case.suite, case.case, other_current)

    def _by_design(self, group: list[tracing.Traced]) -> str | None:
        """Why the reads of one output are a convention's (None: they are not): the output is
        declared, or one integer/bool output of the same call is 0 in every row read."""
        span = group[0].span
        assert span is not None and span.output is not None
        if unwritten_rule.declared(span.op, span.output, span.name):
            return f"declared unwritten by design in {unwritten.UNWRITTEN_ENV}"
        known = unwritten.conventions(span.op).get(span.output)
        markers = self.markers.get(span.call, {})
        order = sorted(markers, key=lambda j: (known is None or j != known.marker, j))
        elements = [t.element for t in group if t.element is not None]
        for j in order:
            if j == span.output:
                continue
            m = markers[j]
            for dims in range(1, min(m.dim(), len(span.shape)) + 1):
                if tuple(m.shape[:dims]) != span.shape[:dims]:
                    break
                valid = unwritten_rule.rows_valid(m, dims).cpu().tolist()
                rows = {_ravel(e[:dims], span.shape[:dims]) for e in elements}
                if not any(valid[r] for r in rows):
                    return (
                        f"{unwritten.label(j, _name_of(self.calls, span.call, j))} of the same "
                        f"call is 0 in every row read ({len(rows)} row(s) of its first "
                        f"{dims} dimension(s))"
                    )
        return None


def _name_of(calls: tracing.Calls, call: int, output: int) -> str | None:
    return next((s.name for s in calls.spans if s.call == call and s.output == output), None)


def _ravel(index: tuple[int, ...], shape: tuple[int, ...]) -> int:
    flat = 0
    for i, n in zip(index, shape, strict=True):
        flat = flat * n + i
    return flat


def _library(kernel: str) -> str | None:
    """The extension library that defines a kernel racecheck names (its anonymous namespaces
    written the way the profiler writes them)."""
    found, _ = ext_watch.locate([kernel.replace("<unnamed>", "(anonymous namespace)")])
    library = next(iter(found.values()), None)
    return os.path.basename(library) if library else None


def _reader(record: SanitizerFinding) -> str:
    name = record.kernel_name or "a kernel"
    if record.kernel_name and torch_kernel(record.kernel_name):
        what = "torch's copy" if "copy" in record.kernel_name else f"torch's {name.split('<')[0]}"
    else:
        what = name
    return what + (f" at {record.python_frame}" if record.python_frame else "")


def _elements(group: list[tracing.Traced]) -> str:
    shown = sorted({t.element for t in group if t.element is not None})
    text = ", ".join(str(e[0]) if len(e) == 1 else str(e) for e in shown[:6])
    return text + (", …" if len(shown) > 6 else "")


def _read_finding(group: list[tracing.Traced], why: str | None, case: CaseInfo) -> Finding:
    first, span = group[0].record, group[0].span
    assert span is not None
    n = sum(t.record.count for t in group)
    readers = sorted({_reader(t.record) for t in group})
    evidence = (
        f"initcheck: {n} read(s) of never-written memory inside {span.describe()}, strides "
        f"{list(span.strides)}, at 0x{span.ptr:x}; elements {_elements(group)}; read by "
        f"{'; '.join(readers)}\nfirst record:\n" + "\n".join(first.lines[:20])
    )[:EVIDENCE_CHARS]
    if why is not None:
        return case.finding(
            unwritten.KIND,
            "info",
            f"{n} initcheck read(s) of {span.label} of `{span.op}` fell where it is "
            f"left unwritten by design ({why}): the extension's convention, not errors",
            op=span.op,
            evidence=evidence,
            hint=unwritten.CONVENTION_HINT,
        )
    if all(t.window is not None and t.window.call == span.call for t in group):
        what = f"was read by its own kernel before it was written, at {n} element(s)"
    else:
        what = f"was never written at {n} element(s) read here"
    return case.finding(
        unwritten.KIND,
        "error",
        f"{span.label} of `{span.op}` {what} ({_elements(group)}); read by "
        f"{readers[0]}" + (f" (+{len(readers) - 1} other reader(s))" if len(readers) > 1 else ""),
        op=span.op,
        kernel=first.kernel_name,
        evidence=evidence,
        hint=unwritten.HINT,
    )


def _race_finding(owner: str, kernel: str, group: list[tracing.Traced], case: CaseInfo) -> Finding:
    window = group[0].window
    records = [t.record for t in group]
    hazards = sum(r.hazards or 0 for r in records)
    sources = sorted({r.source for r in records if r.source})
    frame = f" (called from {window.frame})" if window and window.frame else ""
    who = f"`{owner}` launched {kernel}" if window else f"{kernel} of {owner}"
    return case.finding(
        DATA_RACE,
        "error" if any(r.severity == "error" for r in records) else "warning",
        f"{who}, which races on shared memory ({len(records)} racecheck record(s)"
        + (f", {hazards} hazards" if hazards else "")
        + f"){frame}",
        op=owner if window else None,
        kernel=kernel,
        evidence=(
            (
                f"written while {owner} ran{frame}"
                if window
                else f"no watched call ran; {kernel} is defined in {owner}"
            )
            + f"; accesses at {', '.join(sources[:12]) or 'unknown lines'}\nfirst record:\n"
            + "\n".join(records[0].lines[:12])
        )[:EVIDENCE_CHARS],
        hint=RACE_HINT,
    )


def _oob_finding(op: str, kernel: str, group: list[tracing.Traced], case: CaseInfo) -> Finding:
    window = group[0].window
    records = [t.record for t in group]
    near = next((t.nearest for t in group if t.nearest), None)
    frame = f" (called from {window.frame})" if window and window.frame else ""
    accesses = sorted({f"{r.space or 'global'} {r.access}" for r in records})
    n = sum(r.count for r in records)
    return case.finding(
        OUT_OF_BOUNDS,
        "error",
        f"`{op}` launched {kernel_list([kernel])}, which made {n} invalid "
        f"{'/'.join(accesses)}(s)" + (f": {near}" if near else "") + frame,
        op=op,
        kernel=kernel,
        evidence=(
            f"memcheck, while {op} ran{frame}\nfirst record:\n" + "\n".join(records[0].lines[:12])
        )[:EVIDENCE_CHARS],
        hint=OOB_HINT,
    )
