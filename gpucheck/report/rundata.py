"""Everything a run folder holds, read tolerantly: what the report pages are built from.

A run may have been interrupted, or the harness itself may have died: the results file can end
in a torn line or lack its ``run`` header, the NVML timeline can be missing or torn, and worker
state files can say that a case was still running. Nothing here raises on such a folder; what
could not be read becomes a note (``RunData.problems``) that the report shows.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from gpucheck.model import results
from gpucheck.model.layout import EXTRAS, RunFolder, WorkerFiles, parse_stem

#: record types of results.jsonl the report knows; others are shown as extra tables
KNOWN_RECORDS = ("run", "case", "end", "resume", "diagnosis")
#: extra tables: record type -> title (checkpoint lint, benchmarks; later producers add theirs)
EXTRA_TITLES = {"lint": "Checkpoint lint", "checkpoint-lint": "Checkpoint lint",
                "benchmark": "Benchmarks"}


def parse_time(value: Any) -> float | None:
    """An ISO-8601 timestamp (as the package writes them) as epoch seconds, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def case_span(record: dict[str, Any]) -> tuple[float, float] | None:
    """(start, end) of a case in epoch seconds.

    Records the harness writes for crashed and hung cases are stamped when the harness
    noticed the death, i.e. at the end of the case; worker records at its start.
    """
    t = parse_time(record.get("started_at"))
    if t is None:
        return None
    duration = float(record.get("duration_s") or 0.0)
    if record.get("status") in ("crashed", "hung") or str(record.get("case", "")).startswith("<"):
        return t - duration, t
    return t, t + duration


@dataclass
class WorkerProgress:
    """The last state file of one (device, mode) worker chain."""

    stem: str
    case: str | None  # the case it was in when the run stopped (None: between cases)
    done: int
    total: int
    generations: int


@dataclass
class RunData:
    run_dir: Path
    header: dict[str, Any] | None
    cases: list[dict[str, Any]]
    end: dict[str, Any] | None = None  # an end-of-run record, where the runner writes one
    resumes: list[dict[str, Any]] = field(default_factory=list)  # ``--resume`` records
    extras: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    workers: list[WorkerProgress] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    torn_lines: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str | None:
        if self.header:
            return str(self.header.get("run_id"))
        return str(self.cases[0].get("run_id")) if self.cases else None

    @cached_property
    def devices(self) -> list[str]:
        """Device labels in header order, then any only the case records name."""
        labels = [str(d.get("device")) for d in (self.header or {}).get("devices", [])]
        for r in self.cases:
            if r["device"] not in labels:
                labels.append(r["device"])
        return labels

    @cached_property
    def suites(self) -> list[str]:
        names = list((self.header or {}).get("suites", []))
        for r in self.cases:
            if r["suite"] not in names:
                names.append(r["suite"])
        return names

    def uuid_labels(self) -> dict[str, str]:
        """NVML/CUDA UUID -> device label (cuda:N) of the run."""
        out = {str(d["uuid"]): str(d["device"]) for d in (self.header or {}).get("devices", [])
               if d.get("uuid")}
        for r in self.cases:
            if r.get("device_uuid"):
                out.setdefault(str(r["device_uuid"]), r["device"])
        return out

    @property
    def interrupted(self) -> list[str]:
        """Why the run looks unfinished (empty when every worker ran to its end)."""
        why = []
        if self.end is not None and self.end.get("interrupted"):
            why.append(str(self.end.get("reason") or "the run was interrupted"))
        for w in self.workers:
            if w.case:
                why.append(f"worker {w.stem} stopped inside {w.case} ({w.done} of {w.total} "
                           f"cases done)")
            elif w.total and w.done < w.total:
                why.append(f"worker {w.stem} stopped after {w.done} of {w.total} cases")
        return why

    def started(self) -> float | None:
        t = parse_time((self.header or {}).get("started_at"))
        if t is not None:
            return t
        starts = [s[0] for s in map(case_span, self.cases) if s]
        return min(starts) if starts else None

    def finished(self) -> float | None:
        t = parse_time((self.end or {}).get("finished_at"))
        if t is not None:
            return t
        ends = [s[1] for s in map(case_span, self.cases) if s]
        return max(ends) if ends else None


def _valid_case(r: dict[str, Any]) -> bool:
    return all(isinstance(r.get(k), str) for k in ("device", "suite", "case", "status"))


def _worker_progress(workers_dir: Path) -> list[WorkerProgress]:
    chains: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for path in sorted(workers_dir.glob("*" + WorkerFiles.STATE)):
        files = WorkerFiles.of_state(path)
        device, mode, generation = parse_stem(files.stem)
        base = f"{device}.{mode}"
        try:
            state = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        base_done = len(files.skip.read_text().split()) if files.skip.exists() else 0
        chains[base].append((generation, {**state, "base_done": base_done}))
    out = []
    for base, states in sorted(chains.items()):
        generation, last = max(states, key=lambda x: x[0])
        first_total = min(states, key=lambda x: x[0])[1].get("total")
        out.append(WorkerProgress(
            stem=base, case=last.get("case"),
            done=int(last.get("base_done", 0)) + int(last.get("done") or 0),
            total=int(first_total or last.get("total") or 0), generations=generation + 1))
    return out


def _attach(cases: list[dict[str, Any]], diagnoses: list[dict[str, Any]]) -> None:
    """A diagnosis (e.g. wrong-device, from the differential re-run) is shown as a finding of
    the case it explains."""
    index = {(c.get("device"), c.get("suite"), c.get("case"), c.get("mode")): c for c in cases}
    for d in diagnoses:
        case = index.get((d.get("device"), d.get("suite"), d.get("case"), d.get("mode")))
        if case is not None:
            case["findings"] = [*case.get("findings", []), *d.get("findings", [])]


def load(run_dir: Path) -> RunData:
    """Read a run folder (complete or not) into a RunData (read its ``devices`` and
    ``suites`` only once it is filled: they are cached)."""
    data = RunData(run_dir=run_dir, header=None, cases=[])
    path = RunFolder(run_dir).results
    if not path.exists():
        data.problems.append("no results.jsonl in the run folder: no case finished")
        records: list[dict[str, Any]] = []
    else:
        records, data.torn_lines = results.read_lines(path)
    headers = [r for r in records if r.get("record") == "run"]
    if headers:
        data.header = headers[-1]
        if len(headers) > 1:
            data.problems.append(f"results.jsonl holds {len(headers)} runs; this report shows "
                                 f"the last one ({data.header.get('run_id')})")
    elif records:
        data.problems.append("results.jsonl has no run header (the run was cut short before "
                             "it was written, or the file was assembled by hand)")
    run_id = data.header.get("run_id") if data.header else None
    diagnoses: list[dict[str, Any]] = []
    for r in records:
        kind = r.get("record")
        if run_id is not None and r.get("run_id") not in (None, run_id):
            continue
        if kind == "case":
            if _valid_case(r):
                r.setdefault("findings", [])
                r.setdefault("mode", "plain")
                data.cases.append(r)
            else:
                data.torn_lines += 1
        elif kind == "end":
            data.end = r
        elif kind == "resume":
            data.resumes.append(r)
        elif kind == "diagnosis":
            diagnoses.append(r)
        elif kind not in KNOWN_RECORDS and isinstance(kind, str):
            data.extras.setdefault(kind, []).append(r)
    _attach(data.cases, diagnoses)
    for name in EXTRAS:
        extra = run_dir / name
        if extra.exists():
            rows, _ = results.read_lines(extra)
            data.extras.setdefault(name.removesuffix(".jsonl"), []).extend(rows)
    if data.torn_lines:
        data.problems.append(f"{data.torn_lines} line(s) of results.jsonl could not be read "
                             "(a writer was killed mid-line); they are left out")
    workers = RunFolder(run_dir).workers
    if workers.is_dir():
        data.workers = _worker_progress(workers)
        data.logs = sorted(p for p in workers.iterdir()
                           if p.suffix in (".log", ".txt", ".cmd") and p.is_file())
    return data
