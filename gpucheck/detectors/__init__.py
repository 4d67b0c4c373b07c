"""Detectors: from "a test failed" to "this is the bug", with proof.

Each detector lives in its own module and implements :class:`Detector`. The harness calls
detectors; detectors never call the harness. A detector may act in the worker around each
case (``case_started`` / ``case_finished``) and/or in the parent over the finished records
(``run_finished``); each returns findings naming device, suite, case and, where known, op.
"""

from __future__ import annotations

import os

from gpucheck.detectors.base import BaseDetector, CaseInfo, Detector
from gpucheck.detectors.device_state import DeviceStateLeak
from gpucheck.detectors.op_device import OpDevice

__all__ = ["BaseDetector", "CaseInfo", "Detector", "DeviceStateLeak", "OpDevice",
           "worker_detectors"]


#: ``GPUCHECK_DETECTORS=off`` runs the cases without the worker-side detectors (to measure
#: what they cost, or to rule them out)
DETECTORS_ENV = "GPUCHECK_DETECTORS"


def worker_detectors() -> list[Detector]:
    """The detectors a worker runs around every case."""
    if os.environ.get(DETECTORS_ENV, "").lower() == "off":
        return []
    return [DeviceStateLeak(), OpDevice()]
