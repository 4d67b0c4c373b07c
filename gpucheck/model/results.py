"""The results.jsonl format: one JSON object per line, written and flushed record by record.

The first line is a ``run`` header (with the settings ``--resume`` replays); every other line
is a ``case`` record for one finished (device, suite, case, mode), or a ``resume`` record where
``gpucheck run --resume`` continued the run, and an ``end`` record when it stopped (finished,
interrupted, or the harness failed). A folder holds exactly one run. Appends are
single ``write`` calls on a file opened with O_APPEND, so several worker processes can share
one file, and a run that is interrupted keeps every record already finished. The JSON Schema
is ``results.schema.json`` beside this module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gpucheck.errors import OutputProblem

SCHEMA_ID = "gpucheck.results/1"
STATUSES = ("passed", "failed", "error", "crashed", "hung", "skipped")
#: statuses that make a run unclean (each carries at least one error finding)
BAD_STATUSES = ("failed", "error", "crashed", "hung")
#: characters of a log, a traceback or a tool's record kept as a finding's evidence
EVIDENCE_CHARS = 4000


@dataclass
class Finding:
    kind: str
    severity: str  # "error" | "warning" | "info"
    message: str
    device: str | None = None
    suite: str | None = None
    case: str | None = None
    op: str | None = None
    kernel: str | None = None
    evidence: str | None = None
    hint: str | None = None


@dataclass
class CaseRecord:
    run_id: str
    device: str
    suite: str
    case: str
    mode: str
    status: str
    reason: str | None = None
    duration_s: float = 0.0
    started_at: str | None = None
    device_uuid: str | None = None
    current_device: str | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    signal: str | None = None
    stderr_tail: str | None = None
    findings: list[Finding] = field(default_factory=list)
    #: ``op|inputs|outputs|device`` of extension-op calls (detectors/numerics.py)
    fingerprints: list[str] = field(default_factory=list)
    #: comparisons against a reference (gpucheck.testing.assert_close): measured errors
    numerics: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for optional in ("fingerprints", "numerics"):
            if not data[optional]:
                del data[optional]
        data = {"schema": SCHEMA_ID, "record": "case", **data}
        return data


def schema() -> dict[str, Any]:
    """The JSON Schema of one results.jsonl line."""
    text = resources.files("gpucheck.model").joinpath("results.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def append(path: Path, record: dict[str, Any]) -> None:
    """Append one record as one line, in one write, flushed to disk before returning.

    A record that cannot be written whole (the disk is full, the folder read-only) is taken
    back (no cut line is left for the next record to run into) and raises
    :class:`~gpucheck.errors.OutputProblem`, one sentence."""
    line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = 0
            try:
                while written < len(line):  # a short write (the disk filled mid-line) ...
                    written += os.write(fd, line[written:])
            except OSError:  # ... then fails: take the cut line back, the file stays whole
                if written:
                    os.ftruncate(fd, os.fstat(fd).st_size - written)
                raise
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        raise OutputProblem(
            f"cannot write {path}: {err.strerror or err}; the run stopped here, every record "
            f"written before is kept (make room or make the folder writable, then `gpucheck "
            f"run --resume {path.parent}`)") from err


def read_lines(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The one reader of a results file (or any gpucheck JSON-lines file): its records, and
    how many lines could not be read (torn by a writer killed mid-line, or not an object)."""
    records: list[dict[str, Any]] = []
    torn = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                torn += 1
                continue
            if isinstance(value, dict):
                records.append(value)
            else:
                torn += 1
    return records, torn


def read(path: Path) -> Iterator[dict[str, Any]]:
    """Records of a results file; a torn line (killed mid-write) is skipped."""
    yield from read_lines(path)[0]


def cases(path: Path) -> list[dict[str, Any]]:
    return [r for r in read(path) if r.get("record") == "case"]


def has_errors(records: list[dict[str, Any]]) -> bool:
    """True when any record carries a finding of severity error."""
    return any(f.get("severity") == "error" for r in records for f in r.get("findings", []))
