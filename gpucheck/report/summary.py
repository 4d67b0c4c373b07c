"""What a run amounts to, typed: its counts and times (:class:`Summary`) and its device x
suite matrix (:class:`Cell`), made once from :class:`~gpucheck.report.rundata.RunData` and
the verdict; ``results.json`` writes them (``summary``, ``matrix``), ``report.html`` shows
them."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from gpucheck.model import clock
from gpucheck.report.rundata import RunData
from gpucheck.report.verdict import Verdict

#: worst first: the colour of a matrix cell is its worst case
SEVERITY_ORDER = ("crashed", "hung", "failed", "error", "passed", "skipped")


def worst(statuses: Counter[str] | dict[str, int]) -> str:
    present = [s for s in SEVERITY_ORDER if statuses.get(s)]
    unknown = [s for s in statuses if s not in SEVERITY_ORDER and statuses[s]]
    return (unknown or present or ["empty"])[0]


def iso(t: float | None) -> str | None:
    """An epoch time as the reports write it (ISO, to the second), or None."""
    if t is None:
        return None
    return clock.iso(t, "seconds")


@dataclass(frozen=True)
class Summary:
    """The run in numbers (``results.json``'s ``summary``, in its field order)."""

    verdict: str
    exit_code: int
    why: list[str]
    started_at: str | None
    finished_at: str | None
    duration_s: float | None
    devices: list[str]
    suites: list[str]
    modes: list[str]
    cases: int
    by_status: dict[str, int]
    findings: int
    by_kind: dict[str, int]
    by_severity: dict[str, int]

    @classmethod
    def of(cls, data: RunData, verdict: Verdict) -> Summary:
        started, finished = data.started(), data.finished()
        findings = [f for r in data.cases for f in r.findings]
        modes = list(data.header.modes) if data.header else []
        modes += [m for m in dict.fromkeys(r.mode for r in data.cases) if m not in modes]
        return cls(
            verdict=verdict.name,
            exit_code=verdict.exit_code,
            why=verdict.why,
            started_at=iso(started),
            finished_at=iso(finished),
            duration_s=None
            if started is None or finished is None
            else round(max(0.0, finished - started), 3),
            devices=data.devices,
            suites=data.suites,
            modes=modes,
            cases=len(data.cases),
            by_status=dict(Counter(r.status for r in data.cases)),
            findings=len(findings),
            by_kind=dict(Counter(f.kind for f in findings)),
            by_severity=dict(Counter(f.severity for f in findings)),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Cell:
    """One (device, suite) of the matrix that has cases: its worst status and its counts."""

    device: str
    suite: str
    worst: str
    counts: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def matrix(data: RunData) -> list[Cell]:
    """The cells of every (device, suite) with cases, devices and suites in the run's order."""
    counts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for r in data.cases:
        counts[(r.device, r.suite)][r.status] += 1
    return [
        Cell(d, s, worst(counts[(d, s)]), dict(counts[(d, s)]))
        for d in data.devices
        for s in data.suites
        if (d, s) in counts
    ]
