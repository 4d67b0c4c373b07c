"""compute-sanitizer's records as findings of the case that made them: the one place that
turns a slice of a worker's sanitizer log into findings (the worker, per case, and the
controller, for what a worker that died left in its log: its records, and the out-of-bounds
access it died of, traced to the call it had under way: :func:`crash_findings`), and that
reads a finding's record back (:func:`read_back`, what the report shows)."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpucheck.model.kinds import SYMPTOM, Kind
from gpucheck.model.results import EVIDENCE_CHARS, CaseInfo, Finding
from gpucheck.sanitizer import tracing
from gpucheck.sanitizer.command import LIMIT_REACHED, PRINT_LIMIT, SANITIZER_CRASH
from gpucheck.sanitizer.open_calls import OpenCall
from gpucheck.sanitizer.parser import SanitizerFinding, parse, parse_record

OOB_HINT = (
    "the kernel indexes past the tensor it was given: check its bounds against the sizes it "
    "receives (the element count, the row stride) and the grid's tail block"
)
#: the memcheck records that are an invalid access by a kernel (not an API error, a leak)
ACCESSES = ("read", "write", "atomic", "access")

#: the blank tool line that ends a compute-sanitizer record
RECORD_END = re.compile(rb"^={9} ?\n", re.M)
#: the end of a host frame line ("... [0x7f8e3] in libc10.so"), never of a record's first line
FRAME_END = re.compile(r"\[0x[0-9a-fA-F]+\] in \S+$")

#: a compute-sanitizer record of the case (a symptom: the record of the op that launched its
#: kernel, :mod:`gpucheck.detectors.sanitizer_trace`, is the diagnosis)
SANITIZER = Kind(
    "sanitizer",
    SYMPTOM,
    hint="fix the access the record names; an access on another GPU's memory while "
    "another device was current is a missing OptionalCUDAGuard(device_of(input)) "
    "(the wrong-device check tells)",
    title="compute-sanitizer",
    about="records of compute-sanitizer attached to the case",
)
#: the case during which the tool reached its print limit: its findings may miss some
SANITIZER_LIMIT = Kind(LIMIT_REACHED, SYMPTOM)
#: memcheck's invalid accesses traced to the op that launched their kernel (in a case by
#: :mod:`gpucheck.detectors.sanitizer_trace`, in a worker the tool ended inside a call by the
#: controller: :func:`crash_findings`): it makes the kernel fault, early in the precedence
OUT_OF_BOUNDS = Kind("out-of-bounds", precedence=30)
#: the kinds of compute-sanitizer's findings
KINDS = (SANITIZER, SANITIZER_LIMIT, SANITIZER_CRASH, OUT_OF_BOUNDS)


def read_records(log: Path, offset: int, complete_only: bool = True) -> tuple[str, int]:
    """The records of a sanitizer log after byte ``offset``, and the offset after them.

    With ``complete_only``, a record the tool is still writing (no blank line after it yet)
    is left for the next read.
    """
    with open(log, "rb") as f:
        f.seek(offset)
        data = f.read()
    if not complete_only:
        return data.decode(errors="replace"), offset + len(data)
    ends = list(RECORD_END.finditer(data))
    if not ends:
        return "", offset
    cut = ends[-1].end()
    return data[:cut].decode(errors="replace"), offset + cut


def sanitizer_findings(
    text: str,
    tool: str | None,
    device: str,
    suite: str | None,
    case: str | None,
    other_current: bool = False,
) -> list[Finding]:
    """compute-sanitizer records (a slice of its log) as findings of one case
    (``other_current``: another device than the case's was current, so a memcheck error may
    be a missing device guard, and its hint says so)."""
    return record_findings(parse(text, tool).findings, device, suite, case, other_current)


def record_findings(
    records: list[SanitizerFinding],
    device: str,
    suite: str | None,
    case: str | None,
    other_current: bool = False,
) -> list[Finding]:
    """Parsed records (folded: :func:`~gpucheck.sanitizer.parser.fold`) as ``sanitizer``
    findings of one case (see :func:`sanitizer_findings`)."""
    # One finding per (tool, kernel, kind of error): a missing barrier gives racecheck records
    # for every pair of instructions it leaves unordered (68 for one __syncthreads in SSIM's
    # backward), which are one bug; the evidence keeps the first record and lists the others.
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for f in records:
        what = re.sub(r"\s+(at|in)\s.*", "", f.error) if f.tool == "racecheck" else f.error
        groups.setdefault((f.tool, f.kernel_name, f.api_call, f.severity, what), []).append(f)
    out = []
    for group in groups.values():
        f = group[0]
        where = " ".join(
            x
            for x in (
                f.kernel_name and f"in {f.kernel_name}",
                f.source,
                f.python_frame and f"(from {f.python_frame})",
            )
            if x
        )
        total = sum(g.count for g in group)
        count = f" x{total}" if total > 1 else ""
        others = sorted({g.source for g in group[1:] if g.source and g.source != f.source})
        also = (
            f"\n(and {len(group) - 1} more record(s) of this kind in this kernel"
            f"{', at ' + ', '.join(others[:20]) if others else ''})"
            if len(group) > 1
            else ""
        )
        out.append(
            Finding(
                kind=SANITIZER.name,
                severity=f.severity,
                message=f"{f.error}{count} {where}".strip(),
                device=device,
                suite=suite,
                case=case,
                op=None,
                kernel=f.kernel_name,
                # the head: error line, kernel, thread/block and address come first in a record
                evidence=("\n".join(f.lines[:40])[: EVIDENCE_CHARS - len(also)] + also),
                hint=hint(f.tool, other_current)
                if f.kernel_name
                else (
                    f"a CUDA API call failed ({f.api_call}): usually the consequence of an earlier "
                    "fault in the same case; read the first record"
                    if f.api_call
                    else None
                ),
            )
        )
    return out


def head_cut(evidence: str) -> bool:
    """Whether the head of a record kept as a finding's evidence was cut off (an older
    worker kept the *last* EVIDENCE_CHARS of a record whose C++ host frames are long)."""
    lines = evidence.splitlines()
    return bool(lines) and (lines[0][:1] in (" ", "") or bool(FRAME_END.search(lines[0])))


def read_back(finding: Finding) -> SanitizerFinding | None:
    """The compute-sanitizer record of a ``sanitizer`` finding as read back: its evidence
    (the record's lines, :func:`record_findings`) parsed with the current parser (older runs
    recorded a few kernel names wrongly). A record whose head was cut off (:func:`head_cut`)
    restarts from the finding's message, which holds its first line, with the indented lines
    that survived. None: no evidence, or no record in it."""
    text = finding.evidence or ""
    if not text:
        return None
    lines = text.splitlines()
    if head_cut(text):
        lines = [finding.message or "record"] + [line for line in lines[1:] if line.startswith(" ")]
    return parse_record(lines)


def hint(tool: str, other_current: bool) -> str | None:
    """What to look at for a record of ``tool``; a memcheck record names the device guard
    only where another device was current (with its own device current a guard changes
    nothing)."""
    if tool == "memcheck" and other_current:
        return (
            f"{HINTS['memcheck']}, and that it runs on the device of its inputs (a missing "
            "device guard: the wrong-device check re-runs it with its own device current)"
        )
    return HINTS.get(tool)


HINTS = {
    "memcheck": "an access outside any allocation: check the kernel's bounds and sizes",
    "racecheck": "threads of a block access the same shared memory without a barrier between",
    "initcheck": "the kernel reads device memory nothing wrote (e.g. torch.empty never filled)",
    "synccheck": "a barrier used wrongly (divergent __syncthreads, bad __syncwarp mask)",
}


def dropped_finding(logs: list[str], device: str, suite: str, case: str) -> Finding | None:
    """The finding of a case during which compute-sanitizer reached its print limit, from the
    whole logs of the worker that ran it (the worker ended after that case: the tool's
    summary at the end counts what it did not print, all of it that case's); None when the
    summary says nothing was dropped."""
    reports = [parse(text) for text in logs]
    printed = sum(r.errors_printed for r in reports)
    if reports and all(r.summary_seen for r in reports):
        dropped = sum(
            r.errors_not_printed or max(0, (r.errors_reported or 0) - r.errors_printed)
            for r in reports
        )
        if not dropped:
            return None
        how_many = f"{dropped} more record(s) it counted were not printed"
    else:
        how_many = "an unknown number of records were not printed (the tool wrote no summary)"
    return Finding(
        kind=LIMIT_REACHED,
        severity="warning",
        message=f"compute-sanitizer reached its print limit ({PRINT_LIMIT} records a process) "
        f"during this case: {how_many}, so this case's findings may miss some; the cases after "
        "it ran under a fresh worker",
        device=device,
        suite=suite,
        case=case,
        evidence=f"records printed by the worker's compute-sanitizer: {printed}; its summary: "
        + "; ".join(
            f"{r.errors_reported} error(s) reported, {r.errors_not_printed} not printed"
            for r in reports
        ),
        hint="the records it printed are this case's first ones; run the case alone under the "
        "tool (gpucheck run -k CASE --mode sanitizer:TOOL) to see the rest",
    )


def out_of_bounds(
    op: str, kernel: str, group: list[tracing.Traced], where: CaseInfo, died: bool = False
) -> Finding:
    """The ``out-of-bounds`` finding of memcheck's invalid accesses by ``kernel``, launched
    by a call of ``op`` in the case ``where`` names (``died``: the worker died inside that
    call)."""
    window = group[0].window
    records = [t.record for t in group]
    near = next((t.nearest for t in group if t.nearest), None)
    frame = f" (called from {window.frame})" if window and window.frame else ""
    accesses = sorted({f"{r.space or 'global'} {r.access}" for r in records})
    n = sum(r.count for r in records)
    how = "the worker died inside the call (the tool ended it)" if died else f"while {op} ran"
    return where.finding(
        OUT_OF_BOUNDS.name,
        "error",
        f"`{op}` launched {kernel}, which made {n} invalid {'/'.join(accesses)}(s)"
        + (f": {near}" if near else "")
        + frame,
        op=op,
        kernel=kernel,
        evidence=(f"memcheck, {how}{frame}\nfirst record:\n" + "\n".join(records[0].lines[:12]))[
            :EVIDENCE_CHARS
        ],
        hint=OOB_HINT,
    )


def crash_findings(
    log: str, text: str, tool: str | None, calls: list[OpenCall], where: CaseInfo
) -> list[Finding]:
    """The ``out-of-bounds`` findings of a worker that died during the case ``where`` names:
    memcheck's invalid accesses in ``text`` (the slice of ``log`` no finished case claimed)
    traced to the calls it had under way (:mod:`~gpucheck.sanitizer.open_calls`, innermost
    last), each one's access named against that call's tensors. A record whose Python line is
    another than the call's is left out."""
    if not calls:
        return []
    found = tracing.Calls()
    for i, call in enumerate(calls):  # all under way from before the slice, the last innermost
        found.windows.append(tracing.Window(i, call.op, call.frame, {log: i - len(calls)}))
        found.spans += [replace(s, call=i) for s in call.spans]
    groups: dict[tuple[str, str], list[tracing.Traced]] = {}
    for t in tracing.trace(log, 0, text, tool, found):
        r = t.record
        if r.tool != "memcheck" or r.access not in ACCESSES or not r.kernel_name:
            continue
        if t.window is None or not _same_line(r.python_frame, t.window.frame):
            continue
        groups.setdefault((t.window.op, r.kernel_name), []).append(t)
    return [out_of_bounds(op, kernel, g, where, died=True) for (op, kernel), g in groups.items()]


def _same_line(record_frame: str | None, call_frame: str | None) -> bool:
    """Whether a record's Python line (``test_x.py:76``, the file's name only) is the call's
    (``path/test_x.py:76 in test_overrun``); a record without one may be the call's."""
    if not record_frame or not call_frame:
        return True
    where = call_frame.split(" in ")[0]
    return os.path.basename(where) == os.path.basename(record_frame)
