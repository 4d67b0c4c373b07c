"""What to show for one finding: its evidence as blocks the template renders generically.

A block is ``{"type": "fields", "title", "rows": [(name, value, flag)]}``, ``{"type": "pre",
"title", "text", "open"}`` or ``{"type": "frames", "title", "frames": [(frame, own)]}``. Known
kinds get a reading of their evidence (a sanitizer record's kernel, access, thread and frames;
a crash's signal and the lines that explain it; a hang's stacks); any kind, known or not, gets
its op, kernel, evidence text and the case's memory, so a new kind needs no template change.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gpucheck.model.results import CaseRecord, Finding
from gpucheck.sanitizer import parse as parse_sanitizer

#: kind -> (title, what it means, hint when the finding carries none)
KINDS: dict[str, tuple[str, str, str]] = {
    "crash": (
        "Crashes",
        "the worker process died inside a case (abort, segfault, lost context)",
        "run the case alone under compute-sanitizer memcheck; an abort with "
        "'terminate called' is a C++ exception escaping the extension",
    ),
    "hang": (
        "Hangs",
        "a case made no progress within --timeout and was killed",
        "read the stacks: a thread waiting in a collective or a synchronize names the "
        "call that never returned",
    ),
    "sanitizer": (
        "compute-sanitizer",
        "records of compute-sanitizer attached to the case",
        "fix the access the record names; an access on another GPU's memory while "
        "another device was current is a missing OptionalCUDAGuard(device_of(input)) "
        "(the wrong-device check tells)",
    ),
    "cuda-error": (
        "CUDA errors",
        "a CUDA error raised while the case ran",
        "under CUDA_LAUNCH_BLOCKING=1 the error is raised at the failing launch; "
        "an illegal address only while another device is current is a missing "
        "device guard (the wrong-device check re-runs the case to tell)",
    ),
    "test-failure": (
        "Test failures",
        "an assertion or exception of the test itself",
        "compare the op with its reference on this device; if it passes on "
        "another device, suspect device handling rather than the math",
    ),
    "worker-error": (
        "Worker errors",
        "a worker failed outside any case (collection, start-up)",
        "read the worker's stderr log: an import or build error of the suite",
    ),
    "sanitizer-crash": (
        "compute-sanitizer crashes",
        "compute-sanitizer itself ended while its worker ran: the case's outcome is unknown",
        "run the case alone under compute-sanitizer; the tool's crash hides the "
        "case's result, it is not the case's own",
    ),
    "nvml-error": (
        "NVML errors",
        "NVML failed while the case ran: its NVML memory checks were not made",
        "check the driver (nvidia-smi -q); the case's own result stands",
    ),
}
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
#: the end of a host frame line ("... [0x7f8e3] in libc10.so"), never of a record's first line
FRAME_END = re.compile(r"\[0x[0-9a-fA-F]+\] in \S+$")
GIB = 1024**3


def kind_title(kind: str) -> str:
    if kind in KINDS:
        return KINDS[kind][0]
    return kind.replace("-", " ").replace("_", " ").capitalize()


def kind_about(kind: str) -> str:
    return KINDS[kind][1] if kind in KINDS else ""


def kind_hint(kind: str) -> str:
    """What to do about findings of ``kind``."""
    return KINDS[kind][2] if kind in KINDS else "no hint recorded for this kind of finding"


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


def _sanitizer(text: str, finding: Finding) -> list[dict[str, Any]]:
    lines = text.splitlines()
    cut = bool(lines) and (lines[0][:1] in (" ", "") or bool(FRAME_END.search(lines[0])))
    if cut:
        # The head of the record was cut off (the worker keeps the *last* EVIDENCE_CHARS of a
        # record whose C++ host frames are long): restart it from the finding's message, which
        # holds the record's first line, and keep the indented lines that survived.
        lines = [finding.message or "record"] + [line for line in lines[1:] if line.startswith(" ")]
    report = parse_sanitizer("\n".join(f"========= {line}" for line in lines))
    if not report.findings:
        return []
    f = report.findings[0]
    f.kernel_name = f.kernel_name or finding.kernel
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
            ("kernel", f.kernel_name or f.kernel),
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


def blocks(finding: Finding, record: CaseRecord, labels: dict[str, str]) -> list[dict[str, Any]]:
    """Evidence blocks of one finding of one case record."""
    kind = finding.kind
    text = finding.evidence or ""
    out: list[dict[str, Any]] = []
    if kind == "sanitizer" and text:
        out += _sanitizer(text, finding)
    elif kind == "crash":
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
        title = {
            "hang": "every thread's Python stack, then stderr",
            "crash": "stderr (tail)",
            "sanitizer": "the sanitizer's record",
        }.get(kind, "evidence")
        out.append(
            {
                "type": "pre",
                "title": title,
                "text": text,
                "open": kind in ("hang", "test-failure", "cuda-error", "worker-error")
                or kind not in KINDS,
            }
        )
    tail = record.stderr_tail
    if tail and tail != text and kind not in ("crash", "hang"):
        out.append({"type": "pre", "title": "worker stderr (tail)", "text": tail, "open": False})
    for b in out:  # values as text, whatever type the record held
        if b["type"] == "fields":
            b["rows"] = [(str(name), fmt_value(value), flag) for name, value, flag in b["rows"]]
    return out
