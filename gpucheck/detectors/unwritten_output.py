"""unwritten-output: an extension call returned an output with elements it never wrote.

A rasterizer that allocates its alpha output with ``at::empty`` and skips the pixels of masked
tiles returns whatever the memory held there (``6.7e-27, -3.8e-22, -5.6e+28``): a loss that
reads them trains on garbage, and nothing fails. Around the watched calls of a case
(:mod:`~gpucheck.detectors.op_watch`, pybind11 functions too) this detector has the shared
probe (:mod:`gpucheck.detectors.unwritten`) re-run a call with its fresh allocations filled
with two byte patterns; the elements that hold the pattern after both re-runs are the ones the
call never wrote. One finding per (op, output) a case:

- **error** when nothing marks them: it names the op, the output (index, and name where the
  schema or the pybind11 signature gives one), how many elements, their shape (whole rows, a
  tile pattern, a tail, scattered elements), values the case's own call left there, and the
  Python line of the call;
- **info** (a note: the case stays clean) when they are the extension's convention: another
  output of the call, an integer or bool tensor sharing the leading dimension(s), is 0 in every
  row holding an unwritten element (the 3DGS projection and its zero radius), or an author
  declared the output (``GPUCHECK_UNWRITTEN=op:output``).

**Budget.** A probe costs two more calls of the op, a fill of each fresh allocation and a
comparison of each output. Per worker process each (op, argument signature) is probed on its
first call where its family (op, dtypes, ranks) was not probed yet on a shape of the same
tail pattern (at most :data:`~gpucheck.detectors.budget.SHAPES` shapes a family, and at most
:data:`PROBES_PER_CASE` new signatures a case: :func:`unwritten.wanted
<gpucheck.detectors.unwritten.wanted>`); a signature found leaving an output unwritten by
mistake is probed again on its first :data:`CAP` calls of every later case, and its family on
every new shape (the evidence of those calls: their findings, and what ``numerics`` needs to
tell an unwritten difference from non-determinism). Its seconds are in each case's ``cost_s`` under
``unwritten-output``. In an initcheck pass the probe stands aside (its copies of arguments
read what earlier calls never wrote, which the tool reports): that pass finds the reads
itself, traced to the op (:mod:`gpucheck.detectors.sanitizer_trace`).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from gpucheck.detectors import op_watch, unwritten, unwritten_probe
from gpucheck.detectors.base import (
    READS_REPORTED,
    CallWatcher,
    CaseInfo,
    WorkerContext,
    detector_error,
)
from gpucheck.model.kinds import Kind
from gpucheck.model.results import Finding

#: probes of call signatures not seen before, per case
PROBES_PER_CASE = 8
#: calls per case of a signature found leaving outputs unwritten that are probed again
CAP = 16
_SNAPSHOT = "unwritten.snapshot"
_HOW = (
    "found by re-running the call twice (on copies of its arguments, outside the case's "
    "result) with its fresh allocations filled with 0x{:02X} bytes, then 0x{:02X}: these "
    "elements held the fill, bitwise, after both runs"
).format(*unwritten_probe.PATTERNS)


#: an output the op left unwritten (numerics and the sanitizer's trace find it too)
UNWRITTEN_OUTPUT = Kind(unwritten.KIND, precedence=80)


class UnwrittenOutput(CallWatcher):
    """Probes watched calls within its budget; one finding per (op, output) a case."""

    name = unwritten.KIND
    kinds = (UNWRITTEN_OUTPUT,)
    touches_gpu = True

    def __init__(self) -> None:
        self.watching = False
        self.lock = threading.Lock()
        self.new = 0  # signatures probed for the first time this case
        self.again: dict[tuple[Any, ...], int] = {}  # signature -> probes again this case
        #: (op, output, by design) -> [gap (without its mask), frame, calls]
        self.seen: dict[tuple[str, int, bool], list[Any]] = {}
        self.problems: list[str] = []
        self.told: set[str] = set()  # ops whose probe could not run, told once a process
        self.probing = True  # not in an initcheck pass (see bind)

    def bind(self, worker: WorkerContext) -> None:
        self.probing = worker.sanitizer != READS_REPORTED  # see READS_REPORTED

    def before(self, call: op_watch.Call) -> None:
        if call.depth or not self.probing or not unwritten_probe.probeable(call):
            return
        key = unwritten.signature(call)
        state = unwritten.MEMORY.states.get(key)
        with self.lock:
            if state is None:
                if self.new >= PROBES_PER_CASE or not unwritten.wanted(call):
                    return
                self.new += 1
            elif state == unwritten.UNWRITTEN and self.again.get(key, 0) < CAP:
                self.again[key] = self.again.get(key, 0) + 1
            else:
                return
        try:
            call.notes[_SNAPSHOT] = unwritten_probe.snapshot(call)
        except Exception as err:  # no memory for the copies: this call is not probed
            with self.lock:
                self.problems.append(
                    f"could not copy the arguments of {call.op} to re-run it "
                    f"({type(err).__name__}: {str(err)[:200]}): its outputs were not checked"
                )

    def after(self, call: op_watch.Call, out: Any) -> None:
        snap = call.notes.pop(_SNAPSHOT, None)
        if snap is None or call.error is not None:
            return
        evidence = unwritten_probe.probe(call, out, snap)
        call.notes[unwritten.NOTE] = evidence
        with self.lock:
            if evidence.problem is not None and call.op not in self.told:
                self.told.add(call.op)
                self.problems.append(
                    f"could not re-run {call.op} to look for outputs it leaves unwritten "
                    f"({evidence.problem}): its outputs were not checked"
                )
            for gap in evidence.gaps:
                known = self.seen.get((call.op, gap.index, gap.by_design))
                if known is None:
                    kept = replace(gap, mask=None)
                    self.seen[(call.op, gap.index, gap.by_design)] = [kept, call.frame, 1]
                else:
                    known[2] += 1

    def case_started(self, case: CaseInfo) -> None:
        self.new, self.again, self.seen, self.problems = 0, {}, {}, []
        self.start_watching()

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        if not self.stop_watching():
            return []
        found = [
            finding(op, gap, frame, calls, case)
            for (op, _, _), (gap, frame, calls) in sorted(self.seen.items())
        ]
        found += [detector_error(self.name, p, case, "info") for p in self.problems]
        self.seen, self.problems = {}, []
        return found


def finding(op: str, gap: unwritten.Gap, frame: str | None, calls: int, case: CaseInfo) -> Finding:
    """The finding of one output's unwritten elements: an error, or a note for a convention
    or a declared output."""
    where = f" (called from {frame})" if frame else ""
    times = f" ({calls} calls)" if calls > 1 else ""
    lines = [
        f"{gap.label}: shape {list(gap.shape)}, {gap.dtype}; {gap.count} of {gap.numel} "
        f"elements never written: {gap.where}",
        f"values the case's own call left there: {', '.join(gap.samples)}",
        _HOW,
    ]
    if gap.convention is not None:
        conv = gap.convention
        lines.append(
            f"{conv.label} is an integer/bool output sharing the first {conv.dims} "
            f"dimension(s) and is 0 in every row holding an unwritten element "
            f"({gap.invalid_rows} of {gap.rows} rows are 0)"
        )
        message = (
            f"{op}: {gap.label} is left unwritten in rows where {conv.label} is 0 "
            f"({gap.count} elements, {gap.invalid_rows} of {gap.rows} rows marked invalid): "
            f"the extension's convention, not an error{where}"
        )
    elif gap.declared:
        lines.append(f"declared unwritten by design in {unwritten.UNWRITTEN_ENV}")
        message = (
            f"{op}: {gap.label} leaves {gap.count} elements unwritten ({gap.where}), "
            f"declared by design ({unwritten.UNWRITTEN_ENV}){where}"
        )
    else:
        lines.append(
            "no other output of the call marks them (an integer or bool output sharing "
            "the leading dimension(s), 0 in each of these rows, would make this a convention)"
        )
        message = (
            f"{op}: {gap.label} was never written at {gap.count} of {gap.numel} elements "
            f"({gap.where}); they hold whatever the memory held (this call: "
            f"{', '.join(gap.samples)}){times}{where}"
        )
    if frame:
        lines.append(f"called from {frame}")
    return case.finding(
        unwritten.KIND,
        "info" if gap.by_design else "error",
        message,
        op=op,
        evidence="\n".join(lines),
        hint=unwritten.CONVENTION_HINT if gap.by_design else unwritten.HINT,
    )
