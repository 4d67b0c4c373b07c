"""A worker's state file (``workers/STEM.state.json``): the case under way, its progress, its
pid, why it is about to exit, the findings a crash must not lose. The worker replaces it in
one step whenever it changes (:func:`write`); the controller polls it (:func:`read`), the
report reads what the last one said. Its one writer and its one reader are here, like a case
record's in :mod:`gpucheck.model.results`; the reader is tolerant: a key missing or of another
type (a torn folder, an older gpucheck) reads as its default.

The worker writes it several times a case (:class:`StateWriter`): in place, one ``pwrite`` of
the whole state, padded with spaces over what the last one left, so that the file is whole
whenever the worker is killed (a write of a regular file is not cut short by a signal) and
no write renames or truncates (on ext4 a rename over a file, or a truncation, starts its
writeback: ~0.2 ms each). A reader that meets a write half done (its first ``write`` number
is not its last) reads no state, as it reads none from a file still being made."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucheck.model.layout import read_regular
from gpucheck.model.results import Finding, text

# --- why a worker exits (``exit_reason``) ---------------------------------------------------
#: its CUDA context is lost (a sticky error): it exits with ``EXIT_CONTEXT_LOST``
CONTEXT_LOST = "context-lost"
#: it could not write a record or its state: it exits with ``EXIT_OUTPUT_ERROR``
OUTPUT_ERROR = "output-error"
#: its sanitizer logs are close to compute-sanitizer's print limit: it exits with
#: ``EXIT_SANITIZER_LIMIT`` (``limit_case``: the case during which the limit was reached)
SANITIZER_LIMIT = "sanitizer-limit"
EXIT_REASONS = (CONTEXT_LOST, OUTPUT_ERROR, SANITIZER_LIMIT)

#: bytes of a state file read (its pending findings are small; a bigger file is not ours)
STATE_LIMIT = 16 << 20


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _text(value: Any, limit: int = 2000) -> str | None:
    return text(value, limit) if isinstance(value, str) and value else None


@dataclass
class WorkerState:
    """What a worker's state file says."""

    case: str | None = None  # the case under way (None: between cases)
    suite: str | None = None  # its suite
    current_device: str | None = None  # the device current while it runs
    op: str | None = None  # the extension op it called last (a crash names it)
    started: float | None = None  # epoch seconds: when the case started (or the file written)
    done: int = 0  # cases this worker recorded
    total: int | None = None  # cases it collected (None: not collected yet)
    findings: int = 0  # findings in its records so far
    pid: int | None = None  # the Python worker's pid (not compute-sanitizer's)
    exit_reason: str | None = None  # one of EXIT_REASONS, or None
    #: sanitizer log -> bytes of it the finished cases claimed
    sanitizer_offsets: dict[str, int] = field(default_factory=dict)
    #: findings of the case under way saved before a call that may crash
    pending_findings: list[Finding] = field(default_factory=list)
    #: (suite, case) during which compute-sanitizer reached its print limit (its later
    #: records were not printed), with exit reason ``SANITIZER_LIMIT``
    limit_suite: str | None = None
    limit_case: str | None = None
    #: (pid, start time in clock ticks) of the processes its cases started and left running,
    #: as it last saw them (the controller ends them with it)
    children: list[tuple[int, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "suite": self.suite,
            "current_device": self.current_device,
            "op": self.op,
            "started": self.started,
            "done": self.done,
            "total": self.total,
            "findings": self.findings,
            "pid": self.pid,
            "exit_reason": self.exit_reason,
            "sanitizer_offsets": self.sanitizer_offsets,
            "pending_findings": [dict(f.__dict__) for f in self.pending_findings],
            "limit_suite": self.limit_suite,
            "limit_case": self.limit_case,
            "children": [list(c) for c in self.children],
        }

    @classmethod
    def from_json(cls, value: Any) -> WorkerState | None:
        """The state as read back, or None when ``value`` is not an object."""
        if not isinstance(value, dict):
            return None
        started = value.get("started")
        total = value.get("total")
        pid = value.get("pid")
        reason = value.get("exit_reason")
        offsets = value.get("sanitizer_offsets")
        pending = value.get("pending_findings")
        children = value.get("children")
        return cls(
            case=_text(value.get("case")),
            suite=_text(value.get("suite"), 500),
            current_device=_text(value.get("current_device"), 200),
            op=_text(value.get("op"), 500),
            started=float(started)
            if isinstance(started, int | float) and not isinstance(started, bool)
            else None,
            done=_count(value.get("done")),
            total=_count(total) if isinstance(total, int) else None,
            findings=_count(value.get("findings")),
            pid=_count(pid) or None,
            exit_reason=reason if reason in EXIT_REASONS else None,
            sanitizer_offsets={str(k): v for k, v in offsets.items() if _count(v) or v == 0}
            if isinstance(offsets, dict)
            else {},
            pending_findings=[Finding.from_json(f) for f in pending]
            if isinstance(pending, list)
            else [],
            limit_suite=_text(value.get("limit_suite"), 500),
            limit_case=_text(value.get("limit_case")),
            children=[
                (c[0], c[1])
                for c in (children if isinstance(children, list) else [])
                if isinstance(c, list) and len(c) == 2 and all(_count(x) for x in c)
            ],
        )


#: the keys that number a :class:`StateWriter`'s writes, first and last of its JSON object
WRITE_KEY, WRITE_END_KEY = "write", "write_end"
#: spaces of padding past which a shorter state cuts the file (after its write, in a second step)
PAD_LIMIT = 64 << 10


class StateWriter:
    """The worker's one writer of its state file: each :meth:`write` rewrites the file in
    place (see the module's text), and skips the write when the state is the one already
    there. The file is made on the first write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.size = 0  # bytes in the file
        self.count = 0  # writes made
        self.last: str | None = None  # the state in the file, as written

    def write(self, state: WorkerState) -> None:
        """The state into the file now, unless it is there already. Raises OSError."""
        text = json.dumps(state.to_json())
        if text == self.last:
            return
        self.count += 1
        n = self.count
        data = f'{{"{WRITE_KEY}": {n}, {text[1:-1]}, "{WRITE_END_KEY}": {n}}}'.encode()
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        padded = data + b" " * (self.size - len(data))  # spaces over the longer state before
        written = os.pwrite(self.fd, padded, 0)
        if written != len(padded):  # the disk filled
            raise OSError(f"wrote {written} of {len(padded)} bytes")
        self.size = max(self.size, len(data))
        self.last = text
        if self.size - len(data) > PAD_LIMIT:  # only spaces go
            os.ftruncate(self.fd, len(data))
            self.size = len(data)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def read(path: Path) -> WorkerState | None:
    """The worker's last state, or None where there is none (not written yet, torn, or not a
    regular file)."""
    raw = read_regular(path, STATE_LIMIT)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return None
    if isinstance(value, dict) and value.get(WRITE_KEY) != value.get(WRITE_END_KEY):
        return None  # read while the worker wrote it: half one state, half the one before
    return WorkerState.from_json(value)
