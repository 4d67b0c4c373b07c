"""Everything a run folder holds, read tolerantly: what the report pages are built from.

A run may have been interrupted, or the harness itself may have died: the results file can end
in a torn line or lack its ``run`` header, the NVML timeline can be missing or torn, and worker
state files can say that a case was still running. Nothing here raises on such a folder; what
could not be read becomes a note (``RunData.problems``) that the report shows.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from gpucheck.model import clock, results, worker_state
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
from gpucheck.model.worker_state import WorkerState
from gpucheck.report import timeline as timeline_mod
from gpucheck.report.timeline import Timeline

#: extra tables: record type -> title (checkpoint lint, benchmarks; later producers add theirs)
EXTRA_TITLES = {
    "lint": "Checkpoint lint",
    "checkpoint-lint": "Checkpoint lint",
    "benchmark": "Benchmarks",
}


def case_span(record: CaseRecord) -> tuple[float, float] | None:
    """(start, end) of a case in epoch seconds.

    Records the harness writes for crashed and hung cases are stamped when the harness
    noticed the death, i.e. at the end of the case; worker records at its start.
    """
    t = clock.parse(record.started_at)
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
    #: (start, end) epoch seconds of each invocation of the run (RunLog.invocations)
    invocations: list[tuple[float, float]] = field(default_factory=list)
    #: (device, suite, case, mode) of each case a worker planned that has no record
    unrecorded: list[tuple[str, str, str, str]] = field(default_factory=list)
    extras: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    workers: list[WorkerProgress] = field(default_factory=list)
    #: every worker's last state (``workers/STEM.state.json``), by stem
    states: dict[str, WorkerState] = field(default_factory=dict)
    #: the NVML timeline, downsampled (None: the run has none, or none could be read)
    timeline: Timeline | None = None
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

    @property
    def missing(self) -> list[str]:
        """What the run planned and holds no record of, one sentence each (empty when every
        planned case was recorded): the shards a merged run was made without, and per
        device and mode the planned cases without a record."""
        why = []
        if self.header is not None and (shards := self.header.missing_shards()):
            why.append(
                f"shard {', '.join(shards)} of the plan is missing from this merged run: its "
                "cases were not run or not merged (`gpucheck merge` every shard's folder)"
            )
        by_worker: dict[tuple[str, str], list[str]] = defaultdict(list)
        for device, _, case, mode in self.unrecorded:
            by_worker[(device, mode)].append(case)
        for (device, mode), cases in sorted(by_worker.items()):
            more = f" and {len(cases) - 1} more" if len(cases) > 1 else ""
            why.append(
                f"{len(cases)} case(s) that {device} planned in mode {mode} have no record "
                f"({cases[0]}{more})"
            )
        return why

    def active_seconds(self, now: float | None = None) -> float:
        """Seconds gpucheck worked on the run: each invocation from its start to its end (the
        last one to ``now`` where given: the run's reports), the parts' of a merged run
        added; the time between invocations, when nothing ran, is not counted."""
        spans = list(self.invocations)
        if now is not None and spans:
            spans[-1] = (spans[-1][0], max(spans[-1][1], now))
        parts = sum(p.active_s for p in self.header.parts) if self.header else 0.0
        return parts + sum(end - start for start, end in spans)

    def started(self) -> float | None:
        parts = self.header.parts if self.header else []
        if known := [t for p in parts if (t := clock.parse(p.started_at)) is not None]:
            return min(known)  # a merged run: its first part's start
        t = clock.parse(self.header.started_at if self.header else None)
        if t is not None:
            return t
        starts = [s[0] for s in map(case_span, self.cases) if s]
        return min(starts) if starts else None

    def finished(self) -> float | None:
        t = clock.parse(self.end.finished_at if self.end else None)
        if t is not None:
            return t
        ends = [s[1] for s in map(case_span, self.cases) if s]
        return max(ends) if ends else None


def _states(workers_dir: Path) -> dict[str, WorkerState]:
    """stem -> the last state of every worker of the run that left a readable one."""
    out = {}
    for path in sorted(workers_dir.glob("*" + WorkerFiles.STATE)):
        state = worker_state.read(path)
        if state is not None:
            out[WorkerFiles.of_state(path).stem] = state
    return out


def _worker_progress(workers_dir: Path, states: dict[str, WorkerState]) -> list[WorkerProgress]:
    """Where each (device, mode) chain of workers stopped: its last generation's state, the
    cases its earlier generations recorded (its skip file)."""
    chains: dict[str, list[tuple[int, WorkerState, int]]] = defaultdict(list)
    for stem, state in states.items():
        device, mode, generation = parse_stem(stem)
        skipped = read_regular(WorkerFiles(workers_dir, stem).skip, 64 << 20)
        chains[f"{device}.{mode}"].append(
            (generation, state, len(skipped.split()) if skipped else 0)
        )
    out = []
    for base, chain in sorted(chains.items()):
        generation, last, base_done = max(chain, key=lambda x: x[0])
        first_total = min(chain, key=lambda x: x[0])[1].total
        out.append(
            WorkerProgress(
                stem=base,
                case=last.case,
                done=base_done + last.done,
                total=first_total or last.total or 0,
                generations=generation + 1,
            )
        )
    return out


def load(run_dir: Path, log: RunLog | None = None) -> RunData:
    """Read a run folder (complete or not) into a RunData: its results, its workers' states
    and its NVML timeline, each once; every report is made from it.

    Args:
        run_dir: the run folder.
        log: the reader of its results file that has already followed it (the controller's,
            at the end of a run): only what was appended since is read. None: read the file.
    """
    path = RunFolder(run_dir).results
    if log is None:
        log = RunLog.read(path)
    else:
        log.refresh(final=True)
    data = RunData(
        run_dir=run_dir,
        header=log.header,
        cases=log.diagnosed_cases(),
        end=log.end,
        resumes=log.resumes,
        invocations=log.invocations(),
        unrecorded=log.unrecorded(),
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
    folder = RunFolder(run_dir)
    workers = folder.workers
    if workers.is_dir() and not workers.is_symlink():
        data.states = _states(workers)
        data.workers = _worker_progress(workers, data.states)
        data.logs = sorted(
            p for p in workers.iterdir() if p.suffix in (".log", ".txt", ".cmd") and is_regular(p)
        )
    data.timeline = timeline_mod.read(folder.timeline, data.uuid_labels())
    if data.timeline is not None and data.timeline.torn:
        data.problems.append(
            f"{data.timeline.torn} line(s) of {folder.timeline.name} could not be read"
        )
    return data
