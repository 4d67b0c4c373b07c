"""Detectors: from "a test failed" to "this is the bug", with proof.

Each detector lives in its own module and implements :class:`Detector`
(:mod:`~gpucheck.detectors.base`); :mod:`~gpucheck.detectors.registry` declares which run where
(and lets other packages add theirs). The worker and the controller call detectors;
detectors never call them. A detector may act in the worker around each case
(``case_started`` / ``case_finished``) and/or in the controller over the finished records
(``run_finished``); each returns findings naming device, suite, case and, where known, op.
"""

from __future__ import annotations

from gpucheck.detectors.base import (
    DISABLE_ENV,
    BaseDetector,
    CaseInfo,
    Detector,
    WorkerContext,
)
from gpucheck.detectors.device_state import DeviceStateLeak, PendingError
from gpucheck.detectors.imbalance import Imbalance
from gpucheck.detectors.kernel_device import KernelDevice
from gpucheck.detectors.leak import Leak
from gpucheck.detectors.memory_growth import MemoryGrowth
from gpucheck.detectors.memory_layout import MemoryLayout
from gpucheck.detectors.mixed_devices import MixedDevices
from gpucheck.detectors.numerics import Numerics
from gpucheck.detectors.oom_anomaly import OomAnomaly
from gpucheck.detectors.op_device import OpDevice
from gpucheck.detectors.registry import RunContext, hookimpl, run_detectors, worker_detectors
from gpucheck.detectors.stray_context import StrayContext
from gpucheck.detectors.unwritten_output import UnwrittenOutput
from gpucheck.detectors.wrong_device import WrongDevice
from gpucheck.detectors.wrong_stream import WrongStream

__all__ = [
    "DISABLE_ENV",
    "BaseDetector",
    "CaseInfo",
    "Detector",
    "DeviceStateLeak",
    "Imbalance",
    "KernelDevice",
    "Leak",
    "MemoryGrowth",
    "MemoryLayout",
    "MixedDevices",
    "Numerics",
    "OomAnomaly",
    "OpDevice",
    "PendingError",
    "RunContext",
    "StrayContext",
    "UnwrittenOutput",
    "WorkerContext",
    "WrongDevice",
    "WrongStream",
    "hookimpl",
    "run_detectors",
    "worker_detectors",
]
