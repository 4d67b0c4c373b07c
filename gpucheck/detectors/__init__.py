"""Detectors: from "a test failed" to "this is the bug", with proof.

Each detector lives in its own module and implements :class:`Detector`. The harness calls
detectors; detectors never call the harness. A detector may act in the worker around each
case (``case_started`` / ``case_finished``) and/or in the parent over the finished records
(``run_finished``); each returns findings naming device, suite, case and, where known, op.
"""

from __future__ import annotations

import os

from gpucheck.detectors import wrong_stream
from gpucheck.detectors.base import BaseDetector, CaseInfo, Detector
from gpucheck.detectors.checkpoint_reads import CheckpointReads
from gpucheck.detectors.device_state import DeviceStateLeak
from gpucheck.detectors.double_activation import DoubleActivation
from gpucheck.detectors.imbalance import Imbalance
from gpucheck.detectors.kernel_device import KernelDeviceDetector
from gpucheck.detectors.leak import Leak
from gpucheck.detectors.mixed_devices import MixedDevices
from gpucheck.detectors.numerics import Numerics
from gpucheck.detectors.oom_anomaly import OomAnomaly
from gpucheck.detectors.op_device import OpDevice
from gpucheck.detectors.stray_context import StrayContext
from gpucheck.detectors.wrong_stream import WrongStreamDetector

__all__ = ["BaseDetector", "CaseInfo", "Detector", "DeviceStateLeak", "DoubleActivation",
           "Imbalance", "KernelDeviceDetector", "Leak", "MixedDevices", "Numerics", "OomAnomaly",
           "OpDevice",
           "StrayContext", "WrongStreamDetector", "worker_detectors", "wrong_stream"]

#: comma-separated names of worker detectors to leave out, or ``all`` (e.g. to measure their
#: cost, or to rule them out)
DISABLE_ENV = "GPUCHECK_DISABLE_DETECTORS"


def worker_detectors() -> list[Detector]:
    """The detectors a worker runs around every case (less those named in
    ``$GPUCHECK_DISABLE_DETECTORS``)."""
    off = {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",")}
    every: list[Detector] = [MixedDevices(), DeviceStateLeak(), OpDevice(), WrongStreamDetector(),
                             KernelDeviceDetector(), Numerics(), DoubleActivation(),
                             CheckpointReads(), Leak()]
    return [] if "all" in off else [d for d in every if d.name not in off]
