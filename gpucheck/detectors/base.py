"""The one small Protocol every detector implements."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpucheck.model.kinds import SYMPTOM, Kind
from gpucheck.model.results import CaseData, CaseInfo, CaseRecord, Finding, Severity

__all__ = [
    "READS_REPORTED",
    "BaseDetector",
    "CallWatcher",
    "CaseData",
    "CaseInfo",
    "Detector",
    "WorkerContext",
    "detector_error",
    "disabled",
]

#: comma-separated names of worker detectors to leave out, or ``all`` (e.g. to measure their
#: cost, or to rule them out)
DISABLE_ENV = "GPUCHECK_DISABLE_DETECTORS"


def disabled() -> set[str]:
    """The detector names ``$GPUCHECK_DISABLE_DETECTORS`` turns off (``all``: every one)."""
    return {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}


@dataclass
class WorkerContext:
    """What a worker tells its detectors once, before the first case: its target device
    (index and NVML UUID, None without a GPU), ``persist``, which writes findings made
    before a call that may crash into the worker's state file at once (the controller puts
    them on the crash record), and the compute-sanitizer tool its pass runs under (None
    outside sanitizer passes)."""

    device_index: int | None = None
    uuid: str | None = None
    persist: Callable[[list[Finding]], None] | None = None
    sanitizer: str | None = None


#: a detector that failed, or could only partly do its work (:func:`detector_error`)
DETECTOR_ERROR = Kind("detector-error", SYMPTOM)

#: the compute-sanitizer tool that reports every read of never-written memory: a detector
#: that reads all of an op's outputs (a hash, a comparison) stands aside in its passes, where
#: its reads would be reported (and use up the tool's records) as the case's
READS_REPORTED = "initcheck"


def detector_error(
    name: str, err: BaseException | str, info: CaseInfo, severity: Severity = "warning"
) -> Finding:
    """A detector that failed (``err``), or could only partly do its work (a sentence), is a
    ``detector-error`` on the case (a warning by default, ``info`` for what costs time, not
    coverage), never the case's failure."""
    what = f"failed: {err!r}" if isinstance(err, BaseException) else err
    return info.finding("detector-error", severity, f"detector {name} {what}")


class Detector(Protocol):
    """Where a detector runs is what it implements; every hook returns findings (or None).

    Worker side: ``bind`` once with the worker's context, then around the body of each
    case (its ``call`` phase): ``case_started`` just before, ``case_finished`` just after,
    then ``case_data`` (what the case record keeps besides findings: a
    :class:`~gpucheck.model.results.CaseData`; a plain dict of its fields is read through
    :meth:`CaseData.from_json <gpucheck.model.results.CaseData.from_json>`). Controller
    side: ``run_finished`` over every case record of the run, as read back
    (:class:`~gpucheck.model.results.CaseRecord`).
    """

    name: str
    #: whether ``case_finished`` reads the GPU (streams, memory, results): such a detector
    #: stands down after a CUDA error that lost the process's context
    touches_gpu: bool

    def bind(self, worker: WorkerContext) -> None: ...

    def case_started(self, case: CaseInfo) -> None: ...

    def case_finished(self, case: CaseInfo) -> list[Finding]: ...

    def run_finished(self, records: list[CaseRecord]) -> list[Finding]: ...

    def case_data(self) -> CaseData: ...


class BaseDetector:
    """No-op hooks: a detector overrides the ones for where it runs."""

    name = "base"
    touches_gpu = True
    #: the kinds of finding it declares (:class:`gpucheck.model.kinds.Kind`), collected by
    #: the registry: each kind declared once, by the detector that makes it (another that
    #: makes it too uses that declaration)
    kinds: tuple[Kind, ...] = ()

    def bind(self, worker: WorkerContext) -> None:
        return None

    def case_started(self, case: CaseInfo) -> None:
        return None

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        return []

    def run_finished(self, records: list[CaseRecord]) -> list[Finding]:
        return []

    def case_data(self) -> CaseData:
        return CaseData()


class CallWatcher(BaseDetector):
    """A worker detector that listens to every watched call of a case body
    (:mod:`gpucheck.detectors.op_watch`, its ``before``/``after``): it calls
    :meth:`start_watching` in ``case_started`` and :meth:`stop_watching` in
    ``case_finished``."""

    watching = False

    def start_watching(self) -> None:
        from gpucheck.detectors import op_watch

        self.watching = op_watch.add(self)  # type: ignore[arg-type]

    def stop_watching(self) -> bool:
        """Stop listening; False when it never listened (torch not imported: nothing to
        judge). Re-raises the first exception the listener raised during the case (the
        worker reports it as a detector error)."""
        from gpucheck.detectors import op_watch

        if not self.watching:
            return False
        self.watching = False
        err = op_watch.remove(self)  # type: ignore[arg-type]
        if err is not None:
            raise err
        return True
