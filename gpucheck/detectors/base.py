"""The one small Protocol every detector implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gpucheck.report.results import Finding


@dataclass(frozen=True)
class CaseInfo:
    """The case a worker-side detector watches."""

    device: str  # the target, "cuda:N" or "cpu"
    suite: str
    case: str  # case id, relative to the suite root


class Detector(Protocol):
    """Where a detector runs is what it implements; every hook returns findings (or None).

    Worker side, around the body of each case (its ``call`` phase): ``case_started`` just
    before, ``case_finished`` just after, then ``case_data`` (fields the case record keeps,
    e.g. ``fingerprints``). Parent side: ``run_finished`` over every case record
    of the run (dicts in the results.jsonl format).
    """

    name: str

    def case_started(self, case: CaseInfo) -> None: ...

    def case_finished(self, case: CaseInfo) -> list[Finding]: ...

    def run_finished(self, records: list[dict[str, Any]]) -> list[Finding]: ...

    def case_data(self) -> dict[str, Any]: ...


class BaseDetector:
    """No-op hooks: a detector overrides the ones for where it runs."""

    name = "base"

    def case_started(self, case: CaseInfo) -> None:
        return None

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        return []

    def run_finished(self, records: list[dict[str, Any]]) -> list[Finding]:
        return []

    def case_data(self) -> dict[str, Any]:
        return {}
