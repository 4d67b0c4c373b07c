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
  not an error: the records are left out, and one note says how many. A marker must itself be
  written everywhere (memory fresh from ``cudaMalloc`` often reads 0: an integer output never
  written looks like a marker of every row): right after the call, aside, each integer or bool
  output is read once (its values kept for the rule), and an initcheck read of any of its
  elements, ours or another's, rules it out;
- a **racecheck** hazard is ``data-race`` (its severity: error or warning) naming the op that
  launched the kernel: the call under way when the tool wrote it or, written while gpucheck
  did its own work right after a call (the tool may write it then), that call
  (:func:`gpucheck.sanitizer.tracing.owner`; a kernel another library defines goes to the
  latest call of that library, :func:`gpucheck.detectors.ext_watch.locate`); written outside
  any call, the kernel's library is named. The probe's re-runs of the call race the same way:
  one finding per op and kernel, counting distinct records;
- a **memcheck** invalid access is ``out-of-bounds`` (error) naming the op and the kernel,
  placed the same way, and the tensor of a call the tool names as the nearest allocation
  (``193 bytes after output 0 of ...``). In memcheck passes the calls under way are also
  written beside the logs before each call (:mod:`gpucheck.sanitizer.open_calls`, with what
  each allocates): memcheck's invalid write usually ends the worker inside the call, and the
  controller makes the finding from that file (:func:`gpucheck.sanitizer.findings.
  crash_findings`).

The records stay ``sanitizer`` findings too (the symptoms these diagnoses explain), except a
convention's reads. initcheck reads written while gpucheck did its own work (the probe's
re-runs, numerics' hashing, the marker read: :func:`op_watch.aside
<gpucheck.detectors.op_watch.aside>`) are left out. Cost: in sanitizer passes only, a
``stat`` of the log per call edge and the tensors' addresses; in initcheck passes one read of
each integer or bool output (the values kept until the case's record); in memcheck passes a
small file written per call and per allocation, which a dispatch mode sees.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpucheck.detectors import (
    elf,
    ext_watch,
    op_watch,
    unwritten,
    unwritten_probe,
    unwritten_rule,
)
from gpucheck.detectors.base import READS_REPORTED, CaseInfo
from gpucheck.detectors.launch_windows import torch_kernel
from gpucheck.detectors.mixed_devices import argument_names, labelled_tensors
from gpucheck.model.kinds import Kind
from gpucheck.model.results import EVIDENCE_CHARS, Finding
from gpucheck.sanitizer import open_calls, tracing
from gpucheck.sanitizer.findings import ACCESSES, HINTS, out_of_bounds, record_findings
from gpucheck.sanitizer.parser import SanitizerFinding, fold

DATA_RACE = "data-race"
#: the sanitizer's records traced to the op that launched their kernel: a shared-memory race
#: (it gives wrong values); an access out of bounds is the sanitizer's own kind
#: (:data:`gpucheck.sanitizer.findings.OUT_OF_BOUNDS`: the controller makes it too, for a
#: worker the tool ended inside a call)
KINDS = (Kind(DATA_RACE, precedence=100),)
#: integer/bool outputs up to this many elements are kept for the convention's rule
MAX_MARKER = 1 << 24
NOTE = "sanitizer-trace"
#: the key of a call's allocation mode in ``Call.notes`` (memcheck passes)
_ALLOCATING = "sanitizer-trace.allocating"
RACE_HINT = (
    f"{HINTS['racecheck']}: put a __syncthreads() between the write and the reads of each "
    "shared-memory tile (and before the tile is overwritten), and make every thread of the "
    "block reach it"
)


class SanitizerTrace:
    """Notes the case's watched calls in a sanitizer pass; traces its records to them.

    Args:
        logs: the worker's compute-sanitizer logs, found again when asked.
        tool: the pass's tool (``initcheck``: markers are read; ``memcheck``: the calls under
            way are written to ``open_file``).
        open_file: where a memcheck pass writes the calls under way
            (:mod:`gpucheck.sanitizer.open_calls`).
    """

    name = NOTE  # its seconds around the calls, in a case's ``cost_s``

    def __init__(
        self,
        logs: Callable[[], list[Any]],
        tool: str | None = None,
        open_file: Path | None = None,
    ) -> None:
        self.find_logs = logs
        self.tool = tool
        self.open_file = open_file if tool == "memcheck" else None
        self.logs: list[str] = []
        self.lock = threading.Lock()
        self.calls = tracing.Calls()
        self.markers: dict[int, dict[int, Any]] = {}  # call -> output -> its values != 0
        self.kept: list[Any] = []  # the markers themselves: their memory stays theirs
        self.open: dict[int, tracing.Aside] = {}  # thread -> its aside under way
        self.last: dict[int, tracing.Window] = {}  # thread -> its latest call
        self.under_way: list[open_calls.OpenCall] = []  # memcheck: the calls under way
        self.kernels: dict[str, list[str] | None] = {}  # kernel -> the libraries defining it

    # -- the case ---------------------------------------------------------------------------
    def begin(self) -> None:
        """The case body starts: note its calls from now on."""
        self.logs = [str(p) for p in self.find_logs()]
        self.clear()
        op_watch.add(self)
        op_watch.ASIDE_OBSERVERS.append(self.aside)

    def end(self) -> None:
        """The case body ended (what was noted is kept for :meth:`findings`)."""
        op_watch.remove(self)
        if self.aside in op_watch.ASIDE_OBSERVERS:
            op_watch.ASIDE_OBSERVERS.remove(self.aside)

    def clear(self) -> None:
        """The case's record is made (or the next case begins): let its tensors go."""
        self.calls, self.markers, self.kept, self.open, self.last = tracing.Calls(), {}, [], {}, {}
        self.under_way = []
        if self.open_file is not None:
            open_calls.write(self.open_file, [])

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
            self.last[call.thread] = window
        call.notes[NOTE] = window
        names = argument_names(call.fn)
        spans = [
            span
            for label, t in labelled_tensors(call.args, call.kwargs, names)
            if (span := self._span(index, call.op, label, None, None, t)) is not None
        ]
        if self.open_file is not None and not call.depth:
            self._open(call, spans)

    def after(self, call: op_watch.Call, out: Any) -> None:
        window = call.notes.get(NOTE)
        if not isinstance(window, tracing.Window):
            return
        window.end = self._where()
        if self.open_file is not None and not call.depth:
            self._close(call)
        if call.error is not None:
            return
        names = unwritten.output_names(call.fn)
        outs = call.outputs(out)
        for i, t in enumerate(outs):
            name = names[i] if i < len(names) and names[i] else None
            span = self._span(window.call, call.op, unwritten.label(i, name), i, name, t)
            if span is not None and self.tool == READS_REPORTED and _marker_like(t, outs):
                self._read_marker(window.call, i, t)

    def aside(self, started: bool) -> None:
        thread = threading.get_ident()
        with self.lock:
            if started:
                latest = self.calls.windows[-1] if self.calls.windows else None
                self.open[thread] = tracing.Aside(self._where(), call=self.last.get(thread, latest))
                self.calls.asides.append(self.open[thread])
            elif thread in self.open:
                self.open.pop(thread).end = self._where()

    def _span(
        self, call: int, op: str, label: str, output: int | None, name: str | None, t: Any
    ) -> tracing.Span | None:
        span = _span_of(call, op, label, output, name, t)
        if span is not None:
            with self.lock:
                self.calls.spans.append(span)
        return span

    def _read_marker(self, call: int, index: int, t: Any) -> None:
        """An integer or bool output read once, aside (initcheck passes): where it is not 0,
        for the convention's rule; an element it holds that the call never wrote, initcheck
        reports now, at its address."""
        try:
            with unwritten_probe.alone():
                valid = (t.detach() != 0).cpu()
        except Exception:  # a marker that cannot be read is no marker
            return
        with self.lock:
            self.markers.setdefault(call, {})[index] = valid
            self.kept.append(t)

    # -- memcheck: the calls under way, for the controller ----------------------------------
    def _open(self, call: op_watch.Call, spans: list[tracing.Span]) -> None:
        entry = open_calls.OpenCall(call.op, call.frame, list(spans))
        with self.lock:
            self.under_way.append(entry)
            self._write_open()
        devices = [t.device for t in call.inputs]
        device = next((d for d in devices if d.type == "cuda"), devices[0] if devices else None)
        if device is None or not unwritten_probe.probeable(call):
            return  # no tensor, or a call the dispatch mode must not see (fake, random)
        mode = unwritten_probe.allocating(lambda t: self._allocated(entry, call, t), device)
        mode.__enter__()
        call.notes[_ALLOCATING] = mode

    def _allocated(self, entry: open_calls.OpenCall, call: op_watch.Call, t: Any) -> None:
        window = call.notes.get(NOTE)
        index = window.call if isinstance(window, tracing.Window) else -1
        span = _span_of(index, call.op, "a tensor it allocated", None, None, t)
        if span is not None:
            with self.lock:
                entry.spans.append(dataclasses.replace(span, allocated=True))
                self._write_open()

    def _close(self, call: op_watch.Call) -> None:
        mode = call.notes.pop(_ALLOCATING, None)
        if mode is not None:
            mode.__exit__(None, None, None)
        with self.lock:
            if self.under_way:
                self.under_way.pop()
            self._write_open()

    def _write_open(self) -> None:
        if self.open_file is not None:
            open_calls.write(self.open_file, self.under_way)

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
        unwritten_markers: set[tuple[int, int]] = set()
        for t in tracing.trace(log, start, text, tool, self.calls, self._launches):
            r, span = t.record, t.span
            initcheck = r.tool == "initcheck" and t.element is not None
            if initcheck and span is not None and span.output is not None:
                unwritten_markers.add((span.call, span.output))
            if r.tool not in tracing.KERNEL_TOOLS and t.aside:
                continue  # gpucheck's own reads (the marker's, the probe's)
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
            why = self._by_design(group, unwritten_markers)
            found.append(_read_finding(group, why, case))
            if why is None:
                raw += [t.record for t in group]
        found += [_race_finding(owner, kernel, g, case) for (owner, kernel), g in races.items()]
        found += [out_of_bounds(op, kernel, g, case) for (op, kernel), g in oob.items()]
        return found + record_findings(fold(raw), case.device, case.suite, case.case, other_current)

    def _launches(self, op: str, kernel: str) -> bool | None:
        """Whether the library of ``op`` defines ``kernel`` (None: either is unknown)."""
        library = ext_watch.library_of(op)
        if library is None:
            return None
        if kernel not in self.kernels:
            found, _ = ext_watch.locate([kernel.replace("<unnamed>", elf.ANON)])
            where = next(iter(found.values()), None)
            self.kernels[kernel] = where.split(ext_watch.LIBRARY_SEP) if where else None
        defined = self.kernels[kernel]
        return None if defined is None else library in defined

    def _by_design(
        self, group: list[tracing.Traced], unwritten_markers: set[tuple[int, int]]
    ) -> str | None:
        """Why the reads of one output are a convention's (None: they are not): the output is
        declared, or one integer/bool output of the same call, itself written everywhere (no
        initcheck read of any of its elements: ``unwritten_markers``), is 0 in every row
        read."""
        span = group[0].span
        assert span is not None and span.output is not None
        if unwritten_rule.declared(span.op, span.output, span.name):
            return f"declared unwritten by design in {unwritten.UNWRITTEN_ENV}"
        known = unwritten.conventions(span.op).get(span.output)
        markers = self.markers.get(span.call, {})
        order = sorted(markers, key=lambda j: (known is None or j != known.marker, j))
        elements = [t.element for t in group if t.element is not None]
        for j in order:
            if j == span.output or (span.call, j) in unwritten_markers:
                continue
            m = markers[j]
            for dims in range(1, min(m.dim(), len(span.shape)) + 1):
                if tuple(m.shape[:dims]) != span.shape[:dims]:
                    break
                valid = unwritten_rule.rows_valid(m, dims).tolist()
                rows = {_ravel(e[:dims], span.shape[:dims]) for e in elements}
                if not any(valid[r] for r in rows):
                    return (
                        f"{unwritten.label(j, _name_of(self.calls, span.call, j))} of the same "
                        f"call is 0 in every row read ({len(rows)} row(s) of its first "
                        f"{dims} dimension(s)) and was written everywhere"
                    )
        return None


def _marker_like(t: Any, outs: list[Any]) -> bool:
    """An output that may mark rows of another of ``outs``: integer or bool, of a size worth
    keeping, sharing its first dimension with another output (the others are not read: a read
    of memory never written costs the case's print budget)."""
    return (
        not (t.is_floating_point() or t.is_complex())
        and t.dim() > 0
        and 0 < t.numel() <= MAX_MARKER
        and any(u is not t and u.dim() and u.shape[0] == t.shape[0] for u in outs)
    )


def _span_of(
    call: int, op: str, label: str, output: int | None, name: str | None, t: Any
) -> tracing.Span | None:
    """Where a tensor lies in memory (None: fake, meta or a placeholder; a CPU tensor's
    address never matches a record)."""
    if not unwritten_probe.real(t) or op_watch.placeholder(t):
        return None
    return tracing.Span(
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
    found, _ = ext_watch.locate([kernel.replace("<unnamed>", elf.ANON)])
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
    """One op's (or library's) races in one kernel: its distinct records (the probe's re-runs
    of the call race the same way, and their records are the same)."""
    window = group[0].window
    records = [t.record for t in group]
    distinct = fold(records)
    hazards = sum(r.hazards or 0 for r in distinct)
    sources = sorted({r.source for r in records if r.source})
    frame = f" (called from {window.frame})" if window and window.frame else ""
    who = f"`{owner}` launched {kernel}" if window else f"{kernel} of {owner}"
    late = sum(1 for t in group if t.aside)
    when = (
        f"; {late} of its {len(group)} records written after the call returned, while "
        "gpucheck re-ran it or hashed its outputs"
        if late
        else ""
    )
    return case.finding(
        DATA_RACE,
        "error" if any(r.severity == "error" for r in records) else "warning",
        f"{who}, which races on shared memory ({len(distinct)} racecheck record(s)"
        + (f", {hazards} hazards" if hazards else "")
        + f"){frame}",
        op=owner if window else None,
        kernel=kernel,
        evidence=(
            (
                f"launched by the call of {owner}{frame}{when}"
                if window
                else f"no watched call ran; {kernel} is defined in {owner}"
            )
            + f"; accesses at {', '.join(sources[:12]) or 'unknown lines'}\nfirst record:\n"
            + "\n".join(records[0].lines[:12])
        )[:EVIDENCE_CHARS],
        hint=RACE_HINT,
    )
