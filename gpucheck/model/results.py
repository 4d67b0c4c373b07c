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
import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from gpucheck.errors import OutputProblem
from gpucheck.model import clock
from gpucheck.model.group import GroupRecord
from gpucheck.model.layout import open_regular
from gpucheck.model.memory import Memory
from gpucheck.model.numerics import Measured

SCHEMA_ID = "gpucheck.results/1"
#: a case's outcome: ``crashed`` and ``hung`` are the controller's (the worker died in it)
Status = Literal["passed", "failed", "error", "crashed", "hung", "skipped"]
Severity = Literal["error", "warning", "info"]
STATUSES: tuple[Status, ...] = get_args(Status)
SEVERITIES: tuple[Severity, ...] = get_args(Severity)
#: statuses that make a run unclean (each carries at least one error finding)
BAD_STATUSES: tuple[Status, ...] = ("failed", "error", "crashed", "hung")
#: characters of a log, a traceback or a tool's record kept as a finding's evidence
EVIDENCE_CHARS = 4000
#: characters of one text field kept when a record is read (a folder someone else produced
#: may hold huge fields: each is cut here, saying so, before any report sees it)
FIELD_CHARS = 20000


#: lone surrogates: what JSON can carry (a test id made from bytes that were not UTF-8) but no
#: UTF-8 file or terminal can hold
_SURROGATE = re.compile("[\ud800-\udfff]")
#: where a Python error points in a traceback: ``File "PATH", line N`` (a syntax error) or
#: pytest's ``PATH:N: in <module>`` (an import error); the last one wins
_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)|^(\S+\.py):(\d+): in <module>$', re.M)
#: a finding that says a suite's file could not be collected (imported) at all
COLLECTION_ERROR = "collection-error"
#: a finding that a call got tensors on different devices (the worker saves it before the
#: call runs, so the controller finds it in the state file when the call crashes the worker)
MIXED_DEVICES = "mixed-devices"


def text(value: Any, limit: int = FIELD_CHARS) -> str:
    """``value`` as text of at most ``limit`` characters (what a reader keeps of a field),
    a lone surrogate written as ``\\udcff``."""
    out = value if isinstance(value, str) else str(value)
    if _SURROGATE.search(out):
        out = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", out)
    if len(out) > limit:
        out = f"{out[:limit]}… ({len(out) - limit} more characters cut when read)"
    return out


def _optional_text(value: Any) -> str | None:
    return None if value is None else text(value)


def _number(value: Any, default: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value) if math.isfinite(value) else default


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass
class Finding:
    kind: str
    severity: Severity
    message: str
    device: str | None = None
    suite: str | None = None
    case: str | None = None
    op: str | None = None
    kernel: str | None = None
    evidence: str | None = None
    hint: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> Finding:
        """A finding as read back (tolerant: a folder may be torn or hand-edited): missing
        text becomes ``"unknown"``, an unknown severity ``error`` (nothing read is made
        milder than it may be), every field text, each cut at :data:`FIELD_CHARS`."""
        if not isinstance(value, dict):
            return cls(
                "unreadable-finding",
                "error",
                f"a finding that is not an object: {text(value, 200)}",
            )
        severity = value.get("severity")
        return cls(
            kind=text(value.get("kind") or "unknown", 200),
            severity=severity if severity in SEVERITIES else "error",
            message=text(value.get("message") if value.get("message") is not None else ""),
            **{
                name: _optional_text(value.get(name))
                for name in ("device", "suite", "case", "op", "kernel", "evidence", "hint")
            },
        )

    @property
    def place(self) -> str | None:
        """``path:line`` of the last ``File "...", line N`` in the evidence (a syntax or
        import error in a suite's file), or None. The path in one style: relative to the
        current folder (the one the run was started from), as pytest gives an import
        error's (Python gives a syntax error's absolute)."""
        found = _FILE_LINE.findall(self.evidence or "")
        if not found:
            return None
        path, line, mpath, mline = found[-1]
        return f"{shown_path(path or mpath)}:{line or mline}"


def shown_path(path: str) -> str:
    """``path`` relative to the current folder, as pytest shows the files of a traceback
    (an absolute path only on another drive)."""
    if not os.path.isabs(path):
        return path
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive
        return path


def mixed_devices_hint(finding: Finding, what: str = "CUDA error") -> str:
    """The hint of a CUDA error (or of a crash: ``what``) in a case where a
    :data:`MIXED_DEVICES` finding was made: it names the arguments, not a device guard (the
    worker's recorder and the controller's crash record both give it)."""
    return (
        f"the {what} follows a call of {finding.op} with tensors on different devices "
        f"(the mixed-devices finding of this case): {finding.hint}"
    )


@dataclass(frozen=True)
class CaseInfo:
    """Where a finding is: the case a worker-side detector watches, or a record's case."""

    device: str  # the target, "cuda:N" or "cpu" (a rank's "rank1/cuda:1")
    suite: str
    case: str  # case id, relative to the suite root

    def finding(
        self,
        kind: str,
        severity: Severity,
        message: str,
        *,
        op: str | None = None,
        kernel: str | None = None,
        evidence: str | None = None,
        hint: str | None = None,
    ) -> Finding:
        """A finding about this case (its device, suite and case filled in)."""
        return Finding(
            kind,
            severity,
            message,
            device=self.device,
            suite=self.suite,
            case=self.case,
            op=op,
            kernel=kernel,
            evidence=evidence,
            hint=hint,
        )


#: the ``cost_s`` key of the worker's own bookkeeping (every other key is a detector's, or the
#: per-call watch's ``op-watch``)
BOOKKEEPING = "record"


@dataclass
class CaseRecord:
    run_id: str
    device: str
    suite: str
    case: str
    mode: str
    status: Status
    reason: str | None = None
    duration_s: float = 0.0
    started_at: str | None = None
    device_uuid: str | None = None
    current_device: str | None = None
    memory: Memory = field(default_factory=Memory)
    exit_code: int | None = None
    signal: str | None = None
    stderr_tail: str | None = None
    findings: list[Finding] = field(default_factory=list)
    #: ``op|inputs|outputs|device`` of extension-op calls (detectors/numerics.py)
    fingerprints: list[str] = field(default_factory=list)
    #: comparisons against a reference (gpucheck.testing.assert_close): measured errors
    numerics: list[Measured] = field(default_factory=list)
    #: a distributed group's record: what the watchdog found (kind, cause and waiting ranks)
    distributed: GroupRecord | None = None
    #: gpucheck's own seconds within ``duration_s``, by what spent them: each detector by its
    #: name (its repeats of the body included), ``record`` (the worker's bookkeeping)
    cost_s: dict[str, float] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str, str]:
        """(device, suite, case, mode): what one record is about."""
        return (self.device, self.suite, self.case, self.mode)

    @property
    def info(self) -> CaseInfo:
        """Where the record's case is (its findings' device, suite and case)."""
        return CaseInfo(self.device, self.suite, self.case)

    @property
    def harness_made(self) -> bool:
        """A record the controller wrote for a worker, not for a case (``<worker ...>``)."""
        return self.case.startswith("<")

    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> CaseRecord | None:
        """A case record as read back, or None when it is not one (its device, suite, case
        or status missing or not what a writer writes): tolerant like
        :meth:`Finding.from_json`, so no field a reader uses has another type than declared."""
        device, suite, case, status = (value.get(k) for k in ("device", "suite", "case", "status"))
        if not all(isinstance(v, str) for v in (device, suite, case)) or status not in STATUSES:
            return None
        findings = value.get("findings")
        numerics = value.get("numerics")
        fingerprints = value.get("fingerprints")
        mode = value.get("mode")
        return cls(
            run_id=text(value.get("run_id") or "", 200),
            device=text(device, 200),
            suite=text(suite, 500),
            case=text(case, 2000),
            status=status,
            mode=text(mode, 200) if isinstance(mode, str) and mode else "plain",
            reason=_optional_text(value.get("reason")),
            duration_s=max(0.0, _number(value.get("duration_s"))),
            started_at=_optional_text(value.get("started_at")),
            device_uuid=_optional_text(value.get("device_uuid")),
            current_device=_optional_text(value.get("current_device")),
            memory=Memory.from_json(value.get("memory")),
            exit_code=_integer(value.get("exit_code")),
            signal=_optional_text(value.get("signal")),
            stderr_tail=_optional_text(value.get("stderr_tail")),
            findings=[Finding.from_json(f) for f in findings] if isinstance(findings, list) else [],
            fingerprints=[text(x, 2000) for x in fingerprints]
            if isinstance(fingerprints, list)
            else [],
            numerics=[m for m in map(Measured.from_json, numerics) if m is not None]
            if isinstance(numerics, list)
            else [],
            distributed=GroupRecord.from_json(value.get("distributed")),
            cost_s=_costs(value.get("cost_s")),
        )

    def to_json(self) -> dict[str, Any]:
        """The record's line (its containers shared, not copied: it is written at once)."""
        data = {name: getattr(self, name) for name in _CASE_FIELDS}
        data["memory"] = self.memory.to_json()
        data["findings"] = [asdict(f) for f in self.findings]
        data["numerics"] = [m.to_json() for m in self.numerics]
        data["distributed"] = self.distributed.to_json() if self.distributed else None
        for optional in ("fingerprints", "numerics", "distributed", "cost_s"):
            if not data[optional]:
                del data[optional]
        return {"schema": SCHEMA_ID, "record": "case", **data}


_CASE_FIELDS = tuple(f.name for f in fields(CaseRecord))


@dataclass(frozen=True)
class Origin:
    """Who records cases: one worker (a device, or a rank's ``rank1/cuda:1``, in a mode) of
    one run. The one way a :class:`CaseRecord` is made: the worker's recorder for the cases it
    ran, the controller's harnesses for a worker that died in a case or left records outside
    any."""

    run_id: str
    device: str
    mode: str
    device_uuid: str | None = None

    def at(self, suite: str, case: str) -> CaseInfo:
        """Where a case of this worker is (its findings' place)."""
        return CaseInfo(self.device, suite, case)

    def record(
        self,
        suite: str,
        case: str,
        status: Status,
        *,
        reason: str | None = None,
        started_at: str | None = None,
        duration_s: float = 0.0,
        current_device: str | None = None,
        memory: Memory | None = None,
        exit_code: int | None = None,
        signal: str | None = None,
        stderr_tail: str | None = None,
        findings: list[Finding] | None = None,
        data: CaseData | None = None,
        distributed: GroupRecord | None = None,
    ) -> CaseRecord:
        """The record of case (``suite``, ``case``) of this worker, started now unless
        ``started_at`` says when; ``data``: what its detectors added (fingerprints,
        comparisons, seconds)."""
        data = data or CaseData()
        return CaseRecord(
            run_id=self.run_id,
            device=self.device,
            device_uuid=self.device_uuid,
            suite=suite,
            case=case,
            mode=self.mode,
            status=status,
            reason=reason,
            duration_s=duration_s,
            started_at=started_at or clock.now(),
            current_device=current_device,
            memory=memory or Memory(),
            exit_code=exit_code,
            signal=signal,
            stderr_tail=stderr_tail,
            findings=findings or [],
            fingerprints=data.fingerprints,
            numerics=data.numerics,
            distributed=distributed,
            cost_s=data.cost_s,
        )


@dataclass
class CaseData:
    """What the worker-side detectors add to a case's record besides findings (each one's
    ``case_data()``, added up by the worker's detector loop): the fingerprints of the case's
    calls, its comparisons against references, and the seconds gpucheck spent, by who spent
    them."""

    fingerprints: list[str] = field(default_factory=list)
    numerics: list[Measured] = field(default_factory=list)
    cost_s: dict[str, float] = field(default_factory=dict)

    def add(self, other: CaseData) -> None:
        """``other``'s data added to this (lists after this one's, seconds summed)."""
        self.fingerprints += other.fingerprints
        self.numerics += other.numerics
        self.charge(other.cost_s)

    def charge(self, costs: dict[str, float]) -> None:
        """Seconds spent on the case, added by name."""
        for name, seconds in costs.items():
            self.cost_s[name] = self.cost_s.get(name, 0.0) + seconds

    def to_json(self) -> dict[str, Any]:
        """The data as the record's fields (the empty ones left out)."""
        out: dict[str, Any] = {}
        if self.fingerprints:
            out["fingerprints"] = self.fingerprints
        if self.numerics:
            out["numerics"] = [m.to_json() for m in self.numerics]
        if self.cost_s:
            out["cost_s"] = self.cost_s
        return out

    @classmethod
    def of(cls, value: Any) -> CaseData:
        """A detector's ``case_data()`` as the worker takes it: as is, or read from the dict
        a detector of another package returns (:meth:`from_json`)."""
        return value if isinstance(value, cls) else cls.from_json(value)

    @classmethod
    def from_json(cls, value: Any) -> CaseData:
        """Tolerant: what is not of its type is left out (a detector's data never takes the
        case's record down)."""
        if not isinstance(value, dict):
            return cls()
        fingerprints, numerics = value.get("fingerprints"), value.get("numerics")
        return cls(
            [text(x, 2000) for x in fingerprints] if isinstance(fingerprints, list) else [],
            [m for m in map(Measured.from_json, numerics) if m is not None]
            if isinstance(numerics, list)
            else [],
            _costs(value.get("cost_s")),
        )


def _costs(value: Any) -> dict[str, float]:
    """``cost_s`` as read back: names to non-negative seconds, anything else left out."""
    if not isinstance(value, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in value.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
    }


def schema() -> dict[str, Any]:
    """The JSON Schema of one results.jsonl line."""
    text = resources.files("gpucheck.model").joinpath("results.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


#: case records reach the disk (fsync) at most this often; every other record at once. A
#: record is the kernel's as soon as it is written (a worker that dies after that loses
#: nothing); only a machine going down can lose the case records of its last second, which
#: ``--resume`` runs again (an fsync per case record was a disk round trip for every case).
SYNC_INTERVAL_S = 1.0
_synced: dict[str, float] = {}  # path -> when it was last synced (monotonic)


def append(path: Path, record: dict[str, Any]) -> None:
    """Append one record as one line, in one write; on disk before returning unless it is a
    case record and the file was synced less than :data:`SYNC_INTERVAL_S` ago.

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
            now = time.monotonic()
            key = str(path)
            if record.get("record") != "case" or now - _synced.get(key, -math.inf) >= (
                SYNC_INTERVAL_S
            ):
                os.fsync(fd)
                _synced[key] = now
        finally:
            os.close(fd)
    except OSError as err:
        raise OutputProblem(
            f"cannot write {path}: {err.strerror or err}; the run stopped here, every record "
            f"written before is kept (make room or make the folder writable, then `gpucheck "
            f"run --resume {path.parent}`)"
        ) from err


def read_lines(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Every JSON object of a JSON-lines file as written (the records of other producers a
    run folder holds: checkpoint lint, benchmarks; results files are read typed through
    :class:`~gpucheck.model.runlog.RunLog`), and how many lines could not be read (torn by a
    writer killed mid-line, or not an object). A link or a FIFO is not read."""
    records: list[dict[str, Any]] = []
    torn = 0
    f = open_regular(path)
    if f is None:
        return records, torn
    with f:
        for raw in f:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            try:
                value = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                torn += 1
                continue
            if isinstance(value, dict):
                records.append(value)
            else:
                torn += 1
    return records, torn


def read(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a results file as written (dicts; a torn line is skipped): for tests
    and scripts that check the file itself. gpucheck's own readers read typed records
    through :class:`gpucheck.model.runlog.RunLog`."""
    yield from read_lines(path)[0]


def cases(path: Path) -> list[dict[str, Any]]:
    """The case records of a results file as written (see :func:`read`)."""
    return [r for r in read(path) if r.get("record") == "case"]
