"""The one loop that runs a worker's detectors around a case body, under ``gpucheck run``
(the recorder) and under plain pytest alike."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpucheck.detectors import op_watch
from gpucheck.detectors.base import CaseInfo, Detector, detector_error
from gpucheck.model.results import CaseData, Finding


class DetectorLoop:
    """Detectors around one case body: :meth:`start` before it, :meth:`finish` after it. A
    detector that raises never takes the case down with it: its error becomes a
    ``detector-error`` finding (not after a lost CUDA context, where every detector fails
    the same way and would only repeat the case's own error)."""

    def __init__(self, detectors: list[Detector]) -> None:
        self.detectors = detectors
        self.started: list[Detector] = []
        #: seconds each detector spent on the case under way (start, repeats, finish)
        self.cost: dict[str, float] = {}

    def _charge(self, name: str, t0: float, watch0: float | None = None) -> None:
        """A detector's seconds since ``t0``, less the watch's around the calls it made since
        ``watch0`` (a repeated body's: they count as the per-call watch's)."""
        took = time.perf_counter() - t0
        if watch0 is not None:
            took -= op_watch.spent() - watch0
        self.cost[name] = self.cost.get(name, 0.0) + max(0.0, took)

    def start(self, info: CaseInfo, found: list[Finding]) -> None:
        self.started = []
        self.cost = {}
        op_watch.take_spent()
        for d in self.detectors:
            t0 = time.perf_counter()
            try:
                d.case_started(info)
                self.started.append(d)
            except Exception as err:
                found.append(detector_error(d.name, err, info))
            self._charge(d.name, t0)

    def repeat(self, body: Callable[[], object], times: int) -> None:
        """Run the body ``times`` times more for the detectors that measure across runs
        (``repeat``: the leak detector and its ``gpucheck_repeat`` marker)."""
        for d in self.started:
            again = getattr(d, "repeat", None)
            if again is not None:
                t0, watch0 = time.perf_counter(), op_watch.spent()
                try:
                    again(body, times)
                finally:
                    self._charge(d.name, t0, watch0)

    def finish(
        self, info: CaseInfo, found: list[Finding], data: CaseData, lost_context: bool = False
    ) -> list[str]:
        """Each started detector's findings and data after the body. After a CUDA error that
        lost the process's context (``lost_context``) the detectors that need the GPU
        (:func:`touches_gpu`) stand down: they are ended, and what they would say (read
        from a context that answers every call with the same error) is dropped. Returns
        their names, for the one note the case record gets. Each detector's seconds on the
        case go to ``data.cost_s``, and those taken around the case's op calls under the
        name of whoever took them (:func:`gpucheck.detectors.op_watch.take_spent`)."""
        stood_down = []
        for d in self.started:
            down = lost_context and touches_gpu(d)
            t0 = time.perf_counter()
            try:
                made = d.case_finished(info)
                if not down:
                    found.extend(made)
                    data.add(CaseData.of(d.case_data()))
            except Exception as err:
                if not lost_context:
                    found.append(detector_error(d.name, err, info))
            self._charge(d.name, t0)
            if down:
                stood_down.append(d.name)
        self.started = []
        data.charge(self.cost)
        data.charge(op_watch.take_spent())
        return stood_down


def touches_gpu(detector: Detector) -> bool:
    """Whether a detector reads the GPU when a case ends (a detector that does not say is
    taken to: after a lost context it stands down rather than guess)."""
    return bool(getattr(detector, "touches_gpu", True))


def stood_down_note(names: list[str]) -> str:
    """The note a case record gets when detectors stood down after its CUDA error."""
    return (
        f"gpucheck: the CUDA context was lost with this error, so the detectors that read "
        f"the GPU stood down for this case ({', '.join(names)}); the findings made before "
        "the error (mixed devices, checkpoint reads) stand"
    )
