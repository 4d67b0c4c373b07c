"""The watched calls a memcheck worker has under way, in a file beside its logs: what the
controller needs when compute-sanitizer ends the worker inside a call.

An out-of-bounds write under memcheck aborts the kernel ("unspecified launch failure"); with
torch's caching allocator off (as memcheck needs) the next free of a tensor fails inside a
C++ destructor, and the process ends there (``std::terminate``), before the call returns and
before the case's record is made (seen on an H100: ``test_7_overrun`` of ``tools/gpu
unwritten``). The worker's notes of its calls die with it. So in memcheck passes the worker
writes, before each watched call and at each tensor the call allocates, the calls under way
(:class:`OpenCall`: the op, the Python line, the spans of its tensor arguments and of what it
allocated so far) to ``STEM.sanitizer.calls.json`` (:func:`path_for`), and an empty list when
a case starts and when the call returns. The controller's dead-worker path reads it
(:func:`read`) and traces the memcheck records of the case's slice to that call
(:func:`gpucheck.sanitizer.findings.crash_findings`). The file is small (a few spans a call)
and replaced in one step (written beside, then renamed).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gpucheck.sanitizer.tracing import Span

#: bytes of the file read at most (a few calls' spans; a bigger file is not ours)
LIMIT = 1 << 20


@dataclass
class OpenCall:
    """A watched call under way: its op, the Python line that made it, its tensors' spans
    (its arguments, then each tensor it allocated so far)."""

    op: str
    frame: str | None
    spans: list[Span] = field(default_factory=list)


def path_for(template: str | Path) -> Path:
    """The file of the worker whose compute-sanitizer logs are ``template`` (``--log-file``'s,
    ``STEM.sanitizer.%p.log``)."""
    text = str(template)
    stem = text.removesuffix(".%p.log") if text.endswith(".%p.log") else text
    return Path(stem + ".calls.json")


def write(path: Path, calls: list[OpenCall]) -> None:
    """The calls under way into ``path``, replacing what it held (never raises: a worker that
    cannot write it only loses this help)."""
    data = json.dumps([{**asdict(c), "spans": [asdict(s) for s in c.spans]} for c in calls])
    beside = path.with_name(path.name + ".tmp")
    with contextlib.suppress(OSError):
        beside.write_text(data)
        os.replace(beside, path)


def read(path: Path) -> list[OpenCall]:
    """The calls under way when the worker last wrote ``path`` (none where it holds nothing
    readable)."""
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read(LIMIT))
    except (OSError, ValueError, RecursionError):
        return []
    if not isinstance(value, list):
        return []
    return [c for c in (_call(v) for v in value) if c is not None]


def _call(value: Any) -> OpenCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("op"), str):
        return None
    frame = value.get("frame")
    spans = [s for s in (_span(v) for v in value.get("spans") or []) if s is not None]
    return OpenCall(value["op"], frame if isinstance(frame, str) else None, spans)


def _span(value: Any) -> Span | None:
    """A span as written, or None where a field is missing or of another type."""
    if not isinstance(value, dict):
        return None
    ints = ("call", "ptr", "base", "itemsize")
    texts = ("op", "label", "dtype")
    shape, strides = value.get("shape"), value.get("strides")
    if not (
        all(_int(value.get(k)) for k in ints)
        and all(isinstance(value.get(k), str) for k in texts)
        and _ints(shape)
        and _ints(strides)
        and (value.get("output") is None or _int(value.get("output")))
        and (value.get("name") is None or isinstance(value.get("name"), str))
    ):
        return None
    given = {f.name: value[f.name] for f in fields(Span) if f.name in value}
    return Span(**{**given, "shape": tuple(shape or ()), "strides": tuple(strides or ())})


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(_int(v) for v in value)
