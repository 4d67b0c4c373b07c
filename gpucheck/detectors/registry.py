"""The one registry of detectors and of the kinds of finding they make: gpucheck's own and
those other packages add.

Three hooks (pluggy, the plugin system pytest is built on), each returning a list:

* ``gpucheck_worker_detectors()``: detectors a worker runs around the body of every case
  (``bind``, ``case_started``, ``case_finished``, ``case_data``);
* ``gpucheck_run_detectors(context)``: detectors the controller runs over the finished
  records of a run (``run_finished``), given a :class:`RunContext`;
* ``gpucheck_finding_kinds()``: the kinds of finding the plugin's detectors make, each
  declared once (:class:`gpucheck.model.kinds.Kind`: diagnosis or symptom, its place among
  the root causes, its hint); :func:`kinds` collects them for the report and the controller.

A package adds detectors with an entry point in group ``gpucheck``::

    [project.entry-points.gpucheck]
    my_detectors = "my_package.gpucheck_hooks"

where ``my_package/gpucheck_hooks.py`` implements any of the hooks with ``@hookimpl``
(``from gpucheck.detectors.registry import hookimpl``). ``$GPUCHECK_DISABLE_DETECTORS``
(comma-separated names, or ``all``) leaves worker detectors out by their ``name``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass, field
from typing import TypeVar

import pluggy

from gpucheck import _distribution
from gpucheck.detectors import sanitizer_trace
from gpucheck.detectors.base import DETECTOR_ERROR, Detector, disabled
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
from gpucheck.detectors.stray_context import StrayContext
from gpucheck.detectors.unwritten_output import UnwrittenOutput
from gpucheck.detectors.wrong_device import WrongDevice
from gpucheck.detectors.wrong_stream import WrongStream
from gpucheck.distributed import kinds as distributed_kinds
from gpucheck.model import kinds as recorded_kinds
from gpucheck.model.kinds import Kind, Kinds
from gpucheck.model.runlog import RunHeader
from gpucheck.sanitizer import findings as sanitizer_findings

PROJECT = "gpucheck"
#: the entry point group other packages register their hook modules under
ENTRY_POINT_GROUP = "gpucheck"
#: gpucheck's own entry points in that group (pyproject.toml), by name -> hook module: the
#: checkpoint wing's detectors. Where gpucheck runs without its installed metadata (a
#: checkout on sys.path, or metadata from an install older than them) they are registered
#: from here, so that a run finds the same detectors either way.
OWN_ENTRY_POINTS = {"checkpoints": "gpucheck.checkpoints.detectors.hooks"}

T = TypeVar("T")
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass
class RunContext:
    """What the run-level detectors may need from the run's header."""

    #: NVML UUID -> the run's device label (``cuda:0``)
    device_names: dict[str, str] = field(default_factory=dict)
    #: device label -> total memory in bytes
    memory_totals: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of_header(cls, header: RunHeader | None) -> RunContext:
        devices = header.devices if header is not None else []
        return cls(
            {d.uuid: d.device for d in devices if d.uuid},
            {d.device: d.memory_total for d in devices if d.memory_total},
        )


class Hooks:
    """The hook specifications."""

    @hookspec
    def gpucheck_worker_detectors(self) -> list[Detector]:  # type: ignore[empty-body]
        """Fresh detectors for one worker process, run around every case."""

    @hookspec
    def gpucheck_run_detectors(self, context: RunContext) -> list[Detector]:  # type: ignore[empty-body]
        """Detectors the controller runs over every record of a finished run."""

    @hookspec
    def gpucheck_finding_kinds(self) -> list[Kind]:  # type: ignore[empty-body]
        """The kinds of finding the plugin's detectors make, each declared once."""


class Builtin:
    """gpucheck's own detectors."""

    @hookimpl
    def gpucheck_worker_detectors(self) -> list[Detector]:
        # numerics before the launch trace's two: around a call, its hashing runs before
        # the trace's window opens and after it closes (listeners run in this order before a
        # call, in the reverse order after it), so its kernels are not collected with the op's;
        # the unwritten-output probe between them: its re-runs come after the trace's window
        # of the call, and before numerics hashes the outputs (which reads the probe's evidence)
        return [
            MixedDevices(),
            DeviceStateLeak(),
            OpDevice(),
            Numerics(),
            UnwrittenOutput(),
            WrongStream(),
            KernelDevice(),
            MemoryLayout(),  # after the trace's two: its re-runs inside the call's window
            PendingError(),  # after the trace's windows close: its probe is no op's launch
            Leak(),
        ]

    @hookimpl
    def gpucheck_run_detectors(self, context: RunContext) -> list[Detector]:
        return [
            WrongDevice(),
            StrayContext(context.device_names),
            Numerics(),
            OomAnomaly(context.memory_totals),
            MemoryGrowth(context.memory_totals),
            Imbalance(),
        ]

    @hookimpl
    def gpucheck_finding_kinds(self) -> list[Kind]:
        # what the makers above the registry record (the worker's case, the harness's death,
        # check_op), then what the sanitizer, the watchdog and each detector declare
        detectors = [*self.gpucheck_worker_detectors(), *self.gpucheck_run_detectors(RunContext())]
        return [
            *recorded_kinds.RECORDED,
            *sanitizer_findings.KINDS,
            *distributed_kinds.KINDS,
            DETECTOR_ERROR,
            *sanitizer_trace.KINDS,
            *(kind for d in detectors for kind in getattr(d, "kinds", ())),
        ]


_MANAGER: list[pluggy.PluginManager] = []


def manager() -> pluggy.PluginManager:
    """The plugin manager (made once): the built-in detectors, gpucheck's own entry points,
    then every other installed package's."""
    if not _MANAGER:
        pm = pluggy.PluginManager(PROJECT)
        pm.add_hookspecs(Hooks)
        pm.register(Builtin(), "gpucheck-builtin")
        # gpucheck's own entry points first (from its metadata, else from OWN_ENTRY_POINTS),
        # so that its detectors come before every other package's, in one order
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            own = ep.dist is not None and ep.dist.name == _distribution.NAME
            if own and pm.get_plugin(ep.name) is None:
                pm.register(ep.load(), ep.name)
        for name, module in OWN_ENTRY_POINTS.items():
            if pm.get_plugin(name) is None:
                pm.register(importlib.import_module(module), name)
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        _MANAGER.append(pm)
    return _MANAGER[0]


def _flat(lists: list[list[T]]) -> list[T]:
    # pluggy calls the last registered first: the built-in ones go first in the result
    return [d for group in reversed(lists) for d in (group or [])]


def worker_detectors() -> list[Detector]:
    """Fresh worker-side detectors, less those named in ``$GPUCHECK_DISABLE_DETECTORS``."""
    off = disabled()
    if "all" in off:
        return []
    found = _flat(manager().hook.gpucheck_worker_detectors())
    return [d for d in found if d.name not in off]


def settings() -> dict[str, list[str]]:
    """What decides the detectors of a run besides gpucheck's version (a run header records
    it; ``gpucheck merge`` refuses runs that differ in it): the worker detectors left out
    (``$GPUCHECK_DISABLE_DETECTORS``) and the packages' entry points that add detectors."""
    import importlib.metadata

    points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return {
        "disabled": sorted(disabled()),
        "plugins": sorted(f"{p.name}={p.value}" for p in points),
    }


def run_detectors(context: RunContext) -> list[Detector]:
    """The run-level detectors, in order."""
    return _flat(manager().hook.gpucheck_run_detectors(context=context))


_KINDS: list[Kinds] = []


def kinds() -> Kinds:
    """Every kind of finding declared (made once): gpucheck's own first, then the installed
    packages'; where a package's hook module cannot be loaded, gpucheck's own alone (a
    report is still written; the run's end, which runs the packages' detectors, says why)."""
    if not _KINDS:
        try:
            declared = _flat(manager().hook.gpucheck_finding_kinds())
        except Exception:  # a package's entry point that fails to load
            declared = Builtin().gpucheck_finding_kinds()
        _KINDS.append(Kinds(declared))
    return _KINDS[0]
