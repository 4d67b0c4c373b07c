"""The one reader of a results file: every record typed, every line read once.

A :class:`RunLog` holds what one results file (``results.jsonl``, ``rerun.jsonl``) holds, as
typed records: the run header (:class:`RunHeader`), case records
(:class:`~gpucheck.model.results.CaseRecord`), diagnoses, resume and end records, and the
records of other producers (``extras``, kept as they are). :meth:`RunLog.refresh` reads only
what was appended since the last look, and a line still being written waits for the next one:
the controller follows a file with one log while its workers append to it (progress, re-runs,
diagnoses), and a report reads a finished file in one look (:meth:`RunLog.read`).

Completeness is a fact of the record: each worker writes a ``plan`` record of the cases it
collected (:class:`CasePlan`), and :meth:`RunLog.unrecorded` names every planned case that has
no record, so a run (or a merge of runs) that lost some says so instead of passing.

The reader never trusts the file: a folder may come from someone else, torn, reordered,
duplicated or edited by hand. A line that is not a JSON object, a record without the fields a
reader needs, or a line longer than :data:`MAX_LINE` is counted in ``unreadable`` and left
out; every text field is cut at :data:`~gpucheck.model.results.FIELD_CHARS`; a record that
repeats one already read (the same case of the same run) is counted in ``duplicates`` and
left out (of the two, the one that did not pass is kept); records of another run than the
last header's are left out of ``cases``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gpucheck.model import clock
from gpucheck.model.layout import open_regular
from gpucheck.model.results import BAD_STATUSES, SCHEMA_ID, CaseRecord, Finding, text
from gpucheck.model.settings import RunSettings, shard_of

#: a line longer than this is not parsed (a folder someone else made): it counts as unreadable
MAX_LINE = 64 * 1024 * 1024


def _texts(value: Any) -> list[str]:
    return [text(v, 2000) for v in value] if isinstance(value, list) else []


def _text_map(value: Any) -> dict[str, str]:
    return (
        {text(k, 200): text(v, 2000) for k, v in value.items()} if isinstance(value, dict) else {}
    )


def _maybe(value: Any) -> str | None:
    return None if value is None else text(value, 2000)


@dataclass
class DeviceEntry:
    """One device of the run's header."""

    device: str
    uuid: str | None = None
    name: str | None = None
    memory_total: int | None = None

    @classmethod
    def from_json(cls, value: Any) -> DeviceEntry | None:
        if not isinstance(value, dict) or value.get("device") is None:
            return None
        total = value.get("memory_total", value.get("total_memory"))
        return cls(
            text(value["device"], 200),
            _maybe(value.get("uuid")),
            _maybe(value.get("name")),
            total if isinstance(total, int) and not isinstance(total, bool) else None,
        )


@dataclass
class RunPart:
    """One run folder a merged run was made from (``gpucheck merge``): where it was, its host
    and shard, when it started and how long gpucheck worked on it."""

    folder: str
    host: str = ""
    shard: str | None = None  # "I/N" of a --shard run
    started_at: str | None = None
    active_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Any) -> RunPart | None:
        if not isinstance(value, dict) or not isinstance(value.get("folder"), str):
            return None
        shard, active = value.get("shard"), value.get("active_s")
        return cls(
            text(value["folder"], 2000),
            text(value.get("host") or "", 200),
            text(shard, 20) if isinstance(shard, str) else None,
            _maybe(value.get("started_at")),
            float(active)
            if isinstance(active, int | float) and not isinstance(active, bool) and active >= 0
            else 0.0,
        )

    @property
    def shard_of(self) -> tuple[int, int] | None:
        """(index, count) of the part's shard, None for a run that was not a shard."""
        return shard_of(self.shard)


def missing_shards(parts: list[RunPart]) -> list[str]:
    """The shards (``I/N``) of the plan that ``parts`` lack: the shard count they name, and
    every shard of it should be among them (none for parts that are not shards)."""
    shards = [s for p in parts if (s := p.shard_of) is not None]
    counts = {n for _, n in shards}
    if len(counts) != 1:
        return []
    count = counts.pop()
    present = {i for i, _ in shards}
    return [f"{i}/{count}" for i in range(1, count + 1) if i not in present]


@dataclass
class RunHeader:
    """The ``run`` record: the devices, suites and modes of the run and the settings
    ``--resume`` replays (``config``); ``raw`` is the record as written (``results.json``
    repeats it) and :meth:`field` reads the descriptive fields of it (host, versions)."""

    run_id: str
    started_at: str | None = None
    devices: list[DeviceEntry] = field(default_factory=list)
    suites: list[str] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_runnable: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    config: RunSettings = field(default_factory=lambda: RunSettings(recorded=False))
    #: the run folders a merged run was made from (empty for any other run)
    parts: list[RunPart] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> RunHeader:
        parts = value.get("parts")
        return cls(
            run_id=text(value.get("run_id") or "", 200),
            started_at=_maybe(value.get("started_at")),
            devices=[
                d for d in map(DeviceEntry.from_json, value.get("devices") or []) if d is not None
            ]
            if isinstance(value.get("devices"), list)
            else [],
            suites=_texts(value.get("suites")),
            modes=_texts(value.get("modes")),
            notes=_texts(value.get("notes")),
            not_runnable=_text_map(value.get("not_runnable")),
            command=_texts(value.get("command") or value.get("argv")),
            config=RunSettings.from_json(value.get("config")),
            parts=[p for p in map(RunPart.from_json, parts) if p is not None]
            if isinstance(parts, list)
            else [],
            raw=value,
        )

    def missing_shards(self) -> list[str]:
        """The shards of the plan that a merged run was made without (:func:`missing_shards`
        of its parts)."""
        return missing_shards(self.parts)

    def field(self, *names: str) -> str | None:
        """The first of ``names`` the header holds, as text (None when none does)."""
        for name in names:
            if self.raw.get(name) is not None:
                return text(self.raw[name], 2000)
        return None


@dataclass
class Resume:
    """A ``resume`` record: where ``gpucheck run --resume`` continued the run."""

    run_id: str
    resumed_at: str | None = None
    notes: list[str] = field(default_factory=list)
    not_runnable: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA_ID, "record": "resume", **asdict(self)}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Resume:
        return cls(
            text(value.get("run_id") or "", 200),
            _maybe(value.get("resumed_at")),
            _texts(value.get("notes")),
            _text_map(value.get("not_runnable")),
        )


@dataclass
class RunEnd:
    """An ``end`` record: the run stopped (finished, interrupted, or the harness died)."""

    run_id: str
    finished_at: str | None = None
    interrupted: bool = False
    reason: str | None = None
    stopped_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA_ID, "record": "end", **asdict(self)}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> RunEnd:
        return cls(
            text(value.get("run_id") or "", 200),
            _maybe(value.get("finished_at")),
            value.get("interrupted") is True,
            _maybe(value.get("reason")),
            _maybe(value.get("stopped_by")),
        )


@dataclass
class CasePlan:
    """A ``plan`` record: the cases one worker (a device in a mode, or a rank of a group)
    collected to run, suite by suite, as it starts. A run is complete when each has a record
    (:meth:`RunLog.unrecorded`); a fresh worker that replaces one writes the plan of what it
    has left, and the plans of a (device, mode) add up."""

    run_id: str
    device: str
    mode: str
    #: suite -> its case ids, in the order collected
    cases: dict[str, list[str]] = field(default_factory=dict)

    def planned(self) -> list[tuple[str, str, str, str]]:
        """(device, suite, case, mode) of every case planned."""
        return [(self.device, s, case, self.mode) for s, ids in self.cases.items() for case in ids]

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA_ID, "record": "plan", **asdict(self)}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> CasePlan | None:
        device, mode, cases = value.get("device"), value.get("mode"), value.get("cases")
        if not isinstance(device, str) or not isinstance(mode, str) or not isinstance(cases, dict):
            return None
        return cls(
            text(value.get("run_id") or "", 200),
            text(device, 200),
            text(mode, 200),
            {
                text(suite, 500): [text(c, 2000) for c in ids if isinstance(c, str)]
                for suite, ids in cases.items()
                if isinstance(ids, list)
            },
        )


@dataclass
class Diagnosis:
    """A ``diagnosis`` record: run-level detectors' findings about one case record."""

    run_id: str
    device: str
    suite: str
    case: str
    mode: str
    findings: list[Finding]

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.device, self.suite, self.case, self.mode)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA_ID, "record": "diagnosis", **asdict(self)}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Diagnosis | None:
        where = [value.get(k) for k in ("device", "suite", "case", "mode")]
        findings = value.get("findings")
        if not all(isinstance(v, str) for v in where) or not isinstance(findings, list):
            return None
        device, suite, case, mode = (text(v, 2000) for v in where)
        return cls(
            text(value.get("run_id") or "", 200),
            device,
            suite,
            case,
            mode,
            [Finding.from_json(f) for f in findings],
        )


class RunLog:
    """The typed records of one results file, read incrementally (see the module docstring).

    Attributes:
        path: the file.
        headers: every ``run`` record read (a folder holds one run; more is a problem the
            report names).
        unreadable: lines that could not be read as a record (torn, not JSON, not an object,
            missing fields, too long).
        duplicates: case records left out because the same case of the same run was read
            before.
        extras: records of other producers, by their ``record`` type.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.headers: list[RunHeader] = []
        self.unreadable = 0
        self.duplicates = 0
        self.not_regular = False  # the path is a link, a FIFO or a device: not read
        self.extras: dict[str, list[dict[str, Any]]] = {}
        self._cases: list[CaseRecord] = []
        self._seen: set[tuple[str, str, str, str, str]] = set()
        self._resumes: list[Resume] = []
        self._ends: list[RunEnd] = []
        self._diagnoses: list[Diagnosis] = []
        self._plans: list[CasePlan] = []

    @classmethod
    def read(cls, path: Path) -> RunLog:
        """Everything the file holds now, a torn last line counted as unreadable."""
        log = cls(path)
        log.refresh(final=True)
        return log

    def refresh(self, final: bool = False) -> list[CaseRecord]:
        """Read what was appended since the last look; the case records among it.

        Args:
            final: read a last line without its newline too (the writer is gone); otherwise
                it waits for the next look.
        """
        f = open_regular(self.path)  # a missing file is empty; a link is not followed
        if f is None:
            self.not_regular = self.path.is_symlink() or (
                self.path.exists() and not self.path.is_file()
            )
            return []
        new: list[CaseRecord] = []
        with f:
            f.seek(self.offset)
            while True:
                line = f.readline(MAX_LINE + 1)
                if not line:
                    break
                if not line.endswith(b"\n"):
                    if len(line) > MAX_LINE:  # too long: skip to its end, count it once
                        self.unreadable += 1
                        self.offset += len(line)
                        while (rest := f.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                            self.offset += len(rest)
                        self.offset += len(rest)
                        continue
                    if not final:
                        break  # still being written
                self.offset += len(line)
                self._take(line, new)
        return new

    def _take(self, line: bytes, new: list[CaseRecord]) -> None:
        stripped = line.strip()
        if not stripped:
            return
        try:
            value = json.loads(stripped.decode("utf-8", errors="replace"))
        except (json.JSONDecodeError, RecursionError):
            self.unreadable += 1
            return
        if not isinstance(value, dict):
            self.unreadable += 1
            return
        kind = value.get("record")
        if kind == "case":
            record = CaseRecord.from_json(value)
            if record is None:
                self.unreadable += 1
                return
            seen = (record.run_id, *record.key)
            if seen in self._seen and not record.harness_made:
                self.duplicates += 1
                self._keep_worse(record)
                return
            self._seen.add(seen)
            self._cases.append(record)
            new.append(record)
        elif kind == "run":
            self.headers.append(RunHeader.from_json(value))
        elif kind == "resume":
            self._resumes.append(Resume.from_json(value))
        elif kind == "end":
            self._ends.append(RunEnd.from_json(value))
        elif kind == "plan":
            plan = CasePlan.from_json(value)
            if plan is None:
                self.unreadable += 1
            else:
                self._plans.append(plan)
        elif kind == "diagnosis":
            diagnosis = Diagnosis.from_json(value)
            if diagnosis is None:
                self.unreadable += 1
            else:
                self._diagnoses.append(diagnosis)
        elif isinstance(kind, str):
            self.extras.setdefault(text(kind, 100), []).append(value)
        else:
            self.unreadable += 1

    def _keep_worse(self, record: CaseRecord) -> None:
        """Of two records of one case, the one that did not pass is kept (a duplicate never
        turns a failure into a pass)."""
        if record.status not in BAD_STATUSES:
            return
        for i, kept in enumerate(self._cases):
            if (kept.run_id, *kept.key) == (
                record.run_id,
                *record.key,
            ) and kept.status not in BAD_STATUSES:
                self._cases[i] = record
                return

    @property
    def header(self) -> RunHeader | None:
        """The last run header (None: none was written, or none read yet)."""
        return self.headers[-1] if self.headers else None

    @property
    def run_id(self) -> str | None:
        return self.header.run_id if self.header is not None else None

    def _mine(self, run_id: str) -> bool:
        return self.run_id is None or run_id in ("", self.run_id)

    @property
    def cases(self) -> list[CaseRecord]:
        """Case records of the run (the last header's), in the order written."""
        return [r for r in self._cases if self._mine(r.run_id)]

    def cases_since(self, seen: int) -> tuple[list[CaseRecord], int]:
        """Case records of the run read after the first ``seen`` records of any run, and
        what to pass as ``seen`` next time (a follower's cursor: only the new ones are
        looked at)."""
        return [r for r in self._cases[seen:] if self._mine(r.run_id)], len(self._cases)

    @property
    def resumes(self) -> list[Resume]:
        return [r for r in self._resumes if self._mine(r.run_id)]

    @property
    def ends(self) -> list[RunEnd]:
        """The run's end records, one per invocation that ended (``--resume`` adds one)."""
        return [r for r in self._ends if self._mine(r.run_id)]

    @property
    def end(self) -> RunEnd | None:
        """The run's last end record."""
        ends = self.ends
        return ends[-1] if ends else None

    def invocations(self) -> list[tuple[float, float]]:
        """(start, end) in epoch seconds of each invocation of the run: the first from its
        header, each ``--resume`` from its resume record, to its end record (where it has
        none, its controller died: to its last case record). The time between them, when
        nothing ran, is no invocation's."""
        header = self.header
        starts = [clock.parse(header.started_at if header else None)]
        starts += [clock.parse(r.resumed_at) for r in self.resumes]
        known = sorted(t for t in starts if t is not None)
        ends = sorted(t for e in self.ends if (t := clock.parse(e.finished_at)) is not None)
        cases = [t + r.duration_s for r in self.cases if (t := clock.parse(r.started_at))]
        out = []
        for i, start in enumerate(known):
            until = known[i + 1] if i + 1 < len(known) else float("inf")
            inside = [t for t in ends if start <= t < until]
            inside = inside or [t for t in cases if start <= t < until] or [start]
            out.append((start, max(inside)))
        return out

    @property
    def plans(self) -> list[CasePlan]:
        """The run's ``plan`` records (one per worker started)."""
        return [p for p in self._plans if self._mine(p.run_id)]

    def unrecorded(self) -> list[tuple[str, str, str, str]]:
        """(device, suite, case, mode) of every case a worker of the run planned that has no
        record, in the order planned. A distributed group's record of a fault (written once,
        on the culprit rank) stands for every rank of the group in that case."""
        recorded = {r.key for r in self.cases}
        group = {(r.suite, r.case, r.mode) for r in self.cases if r.distributed is not None}
        missing: dict[tuple[str, str, str, str], None] = {}
        for plan in self.plans:
            for key in plan.planned():
                _, suite, case, mode = key
                if key not in recorded and (suite, case, mode) not in group:
                    missing[key] = None
        return list(missing)

    @property
    def diagnoses(self) -> list[Diagnosis]:
        return [d for d in self._diagnoses if self._mine(d.run_id)]

    def diagnosed_cases(self) -> list[CaseRecord]:
        """The run's case records, each a copy holding the findings of the diagnoses about it
        too (a wrong-device diagnosis from the differential re-run is a finding of the case it
        explains); a diagnosis about no case of the run is left out."""
        extra: dict[tuple[str, str, str, str], list[Finding]] = {}
        for d in self.diagnoses:
            extra.setdefault(d.key, []).extend(d.findings)
        return [
            replace(r, findings=[*r.findings, *extra[r.key]]) if r.key in extra else r
            for r in self.cases
        ]
