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
from gpucheck.model.layout import (
    EXTRAS,
    RunFolder,
    WorkerFiles,
    is_regular,
    parse_stem,
    read_regular,
)
from gpucheck.model.results import CaseRecord
from gpucheck.model.runlog import Resume, RunEnd, RunHeader, RunLog

#: extra tables: record type -> title (checkpoint lint, benchmarks; later producers add theirs)
EXTRA_TITLES = {
    "lint": "Checkpoint lint",
    "checkpoint-lint": "Checkpoint lint",
    "benchmark": "Benchmarks",
}


def parse_time(value: Any) -> float | None:
    """An ISO-8601 timestamp (as the package writes them) as epoch seconds, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def case_span(record: CaseRecord) -> tuple[float, float] | None:
    """(start, end) of a case in epoch seconds.

    Records the harness writes for crashed and hung cases are stamped when the harness
    noticed the death, i.e. at the end of the case; worker records at its start.
    """
    t = parse_time(record.started_at)
    if t is None:
        return None
    if record.status in ("crashed", "hung") or record.harness_made:
        return t - record.duration_s, t
    return t, t + record.duration_s


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
    header: RunHeader | None
    cases: list[CaseRecord]
    end: RunEnd | None = None  # an end-of-run record, where the runner writes one
    resumes: list[Resume] = field(default_factory=list)  # ``--resume`` records
    extras: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    workers: list[WorkerProgress] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    torn_lines: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str | None:
        if self.header:
            return self.header.run_id
        return self.cases[0].run_id if self.cases else None

    @cached_property
    def devices(self) -> list[str]:
        """Device labels in header order, then any only the case records name."""
        labels = [d.device for d in self.header.devices] if self.header else []
        for r in self.cases:
            if r.device not in labels:
                labels.append(r.device)
        return labels

    @cached_property
    def suites(self) -> list[str]:
        names = list(self.header.suites) if self.header else []
        for r in self.cases:
            if r.suite not in names:
                names.append(r.suite)
        return names

    def uuid_labels(self) -> dict[str, str]:
        """NVML/CUDA UUID -> device label (cuda:N) of the run."""
        out = {d.uuid: d.device for d in self.header.devices if d.uuid} if self.header else {}
        for r in self.cases:
            if r.device_uuid:
                out.setdefault(r.device_uuid, r.device)
        return out

    @property
    def interrupted(self) -> list[str]:
        """Why the run looks unfinished (empty when every worker ran to its end)."""
        why = []
        if self.end is not None and self.end.interrupted:
            why.append(self.end.reason or "the run was interrupted")
        for w in self.workers:
            if w.case:
                why.append(
                    f"worker {w.stem} stopped inside {w.case} ({w.done} of {w.total} cases done)"
                )
            elif w.total and w.done < w.total:
                why.append(f"worker {w.stem} stopped after {w.done} of {w.total} cases")
        return why

    def started(self) -> float | None:
        t = parse_time(self.header.started_at if self.header else None)
        if t is not None:
            return t
        starts = [s[0] for s in map(case_span, self.cases) if s]
        return min(starts) if starts else None

    def finished(self) -> float | None:
        t = parse_time(self.end.finished_at if self.end else None)
        if t is not None:
            return t
        ends = [s[1] for s in map(case_span, self.cases) if s]
        return max(ends) if ends else None


def _worker_progress(workers_dir: Path) -> list[WorkerProgress]:
    chains: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for path in sorted(workers_dir.glob("*" + WorkerFiles.STATE)):
        files = WorkerFiles.of_state(path)
        device, mode, generation = parse_stem(files.stem)
        base = f"{device}.{mode}"
        try:
            state = json.loads(read_regular(path) or "")
        except (json.JSONDecodeError, RecursionError):
            continue
        if not isinstance(state, dict):
            continue
        skipped = read_regular(files.skip, 64 << 20)
        base_done = len(skipped.split()) if skipped else 0
        chains[base].append((generation, {**state, "base_done": base_done}))
    out = []
    for base, states in sorted(chains.items()):
        generation, last = max(states, key=lambda x: x[0])
        first_total = min(states, key=lambda x: x[0])[1].get("total")
        case = last.get("case")
        out.append(
            WorkerProgress(
                stem=base,
                case=results.text(case, 2000) if case else None,
                done=_count(last.get("base_done")) + _count(last.get("done")),
                total=_count(first_total) or _count(last.get("total")),
                generations=generation + 1,
            )
        )
    return out


def _count(value: Any) -> int:
    """A count of a state file (0 where the file holds anything else)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def load(run_dir: Path) -> RunData:
    """Read a run folder (complete or not) into a RunData (read its ``devices`` and
    ``suites`` only once it is filled: they are cached)."""
    path = RunFolder(run_dir).results
    log = RunLog.read(path)
    data = RunData(
        run_dir=run_dir,
        header=log.header,
        cases=log.diagnosed_cases(),
        end=log.end,
        resumes=log.resumes,
        extras=log.extras,
        torn_lines=log.unreadable,
    )
    if not path.exists() and not log.not_regular:
        data.problems.append("no results.jsonl in the run folder: no case finished")
    if len(log.headers) > 1 and data.header is not None:
        data.problems.append(
            f"results.jsonl holds {len(log.headers)} runs; this report shows "
            f"the last one ({data.header.run_id})"
        )
    elif data.header is None and (log.cases or log.extras or log.unreadable):
        data.problems.append(
            "results.jsonl has no run header (the run was cut short before "
            "it was written, or the file was assembled by hand)"
        )
    if log.duplicates:
        data.problems.append(
            f"results.jsonl holds {log.duplicates} repeated record(s) of a "
            "case already recorded (the file was assembled or edited by "
            "hand); each case is shown once, the record that did not pass "
            "kept"
        )
    for name in EXTRAS:
        extra = run_dir / name
        if is_regular(extra):
            rows, _ = results.read_lines(extra)
            data.extras.setdefault(name.removesuffix(".jsonl"), []).extend(rows)
    if data.torn_lines:
        data.problems.append(
            f"{data.torn_lines} line(s) of results.jsonl could not be read "
            "(a writer was killed mid-line, or the file was edited); they "
            "are left out"
        )
    if log.not_regular:
        data.problems.append(
            "results.jsonl is not a regular file (a link or a FIFO): it was not read"
        )
    workers = RunFolder(run_dir).workers
    if workers.is_dir() and not workers.is_symlink():
        data.workers = _worker_progress(workers)
        data.logs = sorted(
            p for p in workers.iterdir() if p.suffix in (".log", ".txt", ".cmd") and is_regular(p)
        )
    return data
