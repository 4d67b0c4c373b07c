"""What to show for one finding: its evidence as blocks the template renders generically.

A block is ``{"type": "fields", "title", "rows": [(name, value, flag)]}``, ``{"type": "pre",
"title", "text", "open"}`` or ``{"type": "frames", "title", "frames": [(frame, own)]}``. Known
kinds get a reading of their evidence (a sanitizer record's kernel, access, thread and frames,
as read once: :class:`gpucheck.report.groups.Occurrence`; a crash's signal and the lines that
explain it; a hang's stacks); any kind, known or not, gets its op, kernel, evidence text and
the case's memory, so a new kind needs no template change. A kind's title, what it means and
its hint are its maker's declaration (:mod:`gpucheck.model.kinds`).
"""

from __future__ import annotations

import json
from typing import Any

from gpucheck.model.kinds import CRASH, CUDA_ERROR, HANG, NO_HINT, TEST_FAILURE, WORKER_ERROR
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.report.groups import Occurrence, kinds
from gpucheck.sanitizer.findings import SANITIZER, head_cut
from gpucheck.sanitizer.parser import SanitizerFinding

HOST_NOISE = (
    "in python3",
    "in libtorch",
    "in libc10",
    "in libpython",
    "in libc.so",
    "in libcuda",
    "in libcudart",
    "_PyEval",
    "_PyObject",
    "pybind11::",
)
MAX_FRAMES = 12
GIB = 1024**3
#: kinds whose evidence text is shown unfolded (besides those without a reading of their own)
OPEN = (HANG.name, TEST_FAILURE.name, CUDA_ERROR.name, WORKER_ERROR.name)
#: the title of the evidence text of a kind (default: "evidence")
TEXT_TITLES = {
    HANG.name: "every thread's Python stack, then stderr",
    CRASH.name: "stderr (tail)",
    SANITIZER.name: "the sanitizer's record",
}


def kind_title(kind: str) -> str:
    return kinds().of(kind).heading


def kind_about(kind: str) -> str:
    return kinds().of(kind).about


def kind_hint(kind: str) -> str:
    """What to do about findings of ``kind``."""
    return kinds().of(kind).hint or NO_HINT


def hint_for(finding: Finding) -> str:
    """The finding's own hint, or what to do about findings of its kind."""
    return finding.hint or kind_hint(finding.kind)


def fmt_bytes(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "n/a"
    if value >= GIB / 10:
        return f"{value / GIB:.2f} GiB"
    return f"{value / 2**20:.1f} MiB"


def fmt_value(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, indent=1, default=str)
    return str(value)


def _sanitizer(f: SanitizerFinding | None, finding: Finding) -> list[dict[str, Any]]:
    """The record ``f`` of a sanitizer ``finding`` (as read back: its head restarted from the
    finding's message where it was cut off), field by field."""
    if f is None:
        return []
    cut = head_cut(finding.evidence or "")
    access = None
    if f.access:
        access = " ".join(
            x
            for x in (f.access, f.size and f"of {f.size} bytes", f.space and f"in {f.space} memory")
            if x
        )
    address = " ".join(x for x in (f.address, f.address_relation) if x) or None
    rows = [
        (name, value, False)
        for name, value in (
            ("error", f.error),
            ("kernel", f.kernel_name or finding.kernel or f.kernel),
            ("access", access),
            ("thread", f.thread),
            ("block", f.block),
            ("address", address),
            ("source", f.source),
            ("python frame", f.python_frame),
            ("API call", f.api_call),
            ("hazards", f.hazards),
            ("tool", f.tool),
        )
        if value
    ]
    if cut:
        rows.append(
            (
                "note",
                "the head of this record was cut off in the results file "
                "(thread, block, address may be missing)",
                True,
            )
        )
    blocks: list[dict[str, Any]] = [{"type": "fields", "title": "sanitizer record", "rows": rows}]
    frames = [(fr, not any(n in fr for n in HOST_NOISE)) for fr in f.host_frames]
    if frames:
        own = [fr for fr in frames if fr[1]]
        shown = (own or frames)[:MAX_FRAMES]
        blocks.append(
            {
                "type": "frames",
                "title": f"host frames ({len(own)} of "
                f"{len(frames)} outside Python/torch/CUDA runtime)",
                "frames": shown,
            }
        )
    return blocks


def _crash(text: str, record: CaseRecord) -> list[dict[str, Any]]:
    rows = [("signal", record.signal, True), ("exit code", record.exit_code, False)]
    blocks: list[dict[str, Any]] = [
        {"type": "fields", "title": "how it died", "rows": [r for r in rows if r[1] is not None]}
    ]
    # the record's stderr digest starts with the lines that explain the death (the finding's
    # evidence is only its last part)
    head, sep, _ = (record.stderr_tail or text).partition("--- tail ---")
    if sep and head.strip():
        blocks.append(
            {
                "type": "pre",
                "title": "the lines that explain it",
                "text": head.strip(),
                "open": True,
            }
        )
    return blocks


def _memory(record: CaseRecord, labels: dict[str, str]) -> dict[str, Any] | None:
    mem = record.memory
    rows = [
        (name, fmt_bytes(value), False)
        for name, value in (
            ("torch peak allocated", mem.torch_peak_allocated),
            ("torch peak reserved", mem.torch_peak_reserved),
            (f"NVML peak on {record.device}", mem.nvml_peak_used),
        )
        if value is not None
    ]
    for uuid, used in (mem.nvml_peak_other_devices or {}).items():
        rows.append(
            (
                f"NVML peak on {labels.get(uuid, uuid)} (another GPU: stray context)",
                fmt_bytes(used),
                True,
            )
        )
    current = record.current_device
    if current and current != record.device:
        rows.append(("current device while it ran", current, False))
    return {"type": "fields", "title": "memory", "rows": rows} if rows else None


def blocks(o: Occurrence, labels: dict[str, str]) -> list[dict[str, Any]]:
    """Evidence blocks of one finding of one case record."""
    finding, record = o.finding, o.record
    kind = finding.kind
    text = finding.evidence or ""
    out: list[dict[str, Any]] = []
    if kind == SANITIZER.name and text:
        out += _sanitizer(o.sanitizer, finding)
    elif kind == CRASH.name:
        out += _crash(text, record)
    # a sanitizer block names the kernel already
    extra = [
        (name, value, False)
        for name, value in (("op", finding.op), ("kernel", finding.kernel))
        if value and not (name == "kernel" and out)
    ]
    if extra:
        out.append({"type": "fields", "title": "details", "rows": extra})
    mem = _memory(record, labels)
    if mem is not None:
        out.append(mem)
    if text:
        out.append(
            {
                "type": "pre",
                "title": TEXT_TITLES.get(kind, "evidence"),
                "text": text,
                "open": kind in OPEN or not kinds().of(kind).title,
            }
        )
    tail = record.stderr_tail
    if tail and tail != text and kind not in (CRASH.name, HANG.name):
        out.append({"type": "pre", "title": "worker stderr (tail)", "text": tail, "open": False})
    for b in out:  # values as text, whatever type the record held
        if b["type"] == "fields":
            b["rows"] = [(str(name), fmt_value(value), flag) for name, value, flag in b["rows"]]
    return out
