"""gpucheck's pytest plugin (entry point ``pytest11``): markers and device fixtures for suites.

Users' own suites get:

* markers ``gpu``, ``multigpu``, ``sanitizer`` (small enough to run under compute-sanitizer;
  ``sanitizer(tools=("racecheck",))``: only in the passes of the tools named) and ``slow``;
* ``gpu_device``: a ``torch.device`` for each target CUDA device (the test is parametrized
  over them). Before the test body runs, another visible device is made current *and
  initialized*, so an extension that forgets its device guard launches on the wrong device
  the way it does in real training, and a fresh non-default stream is current on the target
  device (``GPUCHECK_STREAM=default`` leaves stream 0), so an extension that launches on
  stream 0 instead of the current stream runs unordered with the caller's work;
* ``other_device``: that other device, or ``None`` when only one device is visible.

* ``nvml_tracker``: this process's GPU memory over the test, sampled with NVML (timeline and
  peak per device); ``available`` is False (and every value N/A) where NVML is not;
* ``gpucheck_findings``: ``gpucheck_findings.attach(kind, message, severity=..., op=...)``
  adds a finding to the test's case record under ``gpucheck run`` (next to the detectors'),
  and to the terminal summary, the JUnit properties and the exit status under plain pytest;
* the functions of compiled torch extensions (pybind11 modules) are watched per call like
  ``torch.ops`` (:mod:`gpucheck.detectors.ext_watch`, installed before the first conftest);
  marker ``gpucheck_unwatched("pkg._C", "pkg._C.fn")`` or ``GPUCHECK_UNWATCHED`` opts out.

Target devices: ``--gpucheck-device N`` (repeatable) or ``GPUCHECK_DEVICES=0,1``; default: all
visible devices. Without a CUDA device, tests using ``gpu_device`` are skipped with a reason.

Under ``pytest -n N`` (pytest-xdist) each worker is pinned to one target device: ``gwK`` tests
on target ``K mod (number of targets)``, so ``-n auto`` spreads a suite over every GPU; the
test ids say ``[gpu]`` instead of ``[cudaK]`` (every worker must collect the same ids). Outside
``gpucheck run`` the worker-side detectors (:mod:`gpucheck.detectors`) still watch every test
that uses ``gpu_device``; their findings go where attached ones go. After a CUDA error that
loses the process's context, its later CUDA tests error in setup as "not run" (``gpucheck
run`` instead ends the worker and goes on in a fresh one).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from gpucheck.runner.nvml_sampler import NvmlTracker  # the nvml_tracker fixture's

MARKERS = {
    "gpu": "needs a CUDA device",
    "multigpu": "needs two or more CUDA devices",
    "sanitizer": "small enough to run under compute-sanitizer (memcheck slows launches ~37x); "
                 "sanitizer(tools=('racecheck', ...)): only in the passes of those tools",
    "slow": "takes long (soak tests, large sizes)",
    # the leak detector's marker (gpucheck/detectors/leak.py)
    "gpucheck_repeat": "(n=5) under gpucheck run the body runs n times (fixtures once) and "
                       "memory that grows from run to run is a leak finding",
    # the compiled-extension watch's opt-out (gpucheck/detectors/ext_watch.py)
    "gpucheck_unwatched": "('pkg._C', 'pkg._C.fn', ...) calls of these compiled extension "
                          "modules or functions get no per-call checks in this test "
                          "(GPUCHECK_UNWATCHED does it for every test)",
}
DEVICES_ENV = "GPUCHECK_DEVICES"
#: "other" (default): another device is current and initialized while the target is tested;
#: "target": the target itself is current and no other device is touched
CURRENT_ENV = "GPUCHECK_CURRENT"
#: "poisoned" (default): a non-default stream is current on the target device during a test;
#: "default": the default stream stays current
STREAM_ENV = "GPUCHECK_STREAM"
#: marks the tests of gpucheck's own kernels (our suites); not needed in users' suites
KERNELS_MARKER = "gpucheck_kernels"
#: the ``dist_rank`` fixture of distributed cases (gpucheck run --distributed, torchrun)
pytest_plugins = ("gpucheck.dist.fixtures",)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpucheck")
    group.addoption(
        "--gpucheck-device",
        action="append",
        type=int,
        default=None,
        metavar="N",
        help=f"target CUDA device index (repeatable; default: ${DEVICES_ENV} or all visible)",
    )


    from gpucheck.runner.worker import add_options

    add_options(group)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Watch compiled extensions before the first conftest imports one."""
    from gpucheck.detectors import ext_watch

    ext_watch.install_unless_disabled()


def pytest_configure(config: pytest.Config) -> None:
    from gpucheck.detectors import ext_watch

    ext_watch.install_unless_disabled()  # no-op when pytest_load_initial_conftests did it
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    config.addinivalue_line("markers", f"{KERNELS_MARKER}: tests gpucheck's own CUDA kernels "
                                       "(the run stops once, with the fix, if they are not built)")
    if config.getoption("--gpucheck-device"):
        target_devices(config)  # a bad index is a usage error before collection starts
    if config.getoption("--gpucheck-results"):
        from gpucheck.runner.worker import Recorder

        config.pluginmanager.register(Recorder(config), "gpucheck-recorder")
    _ATTACHED.clear()
    _REPORTED.clear()
    _CONTEXT_LOST.clear()
    _NOT_RUN.clear()


def sanitizer_tools(item: pytest.Item) -> tuple[str, ...] | None:
    """The compute-sanitizer tools a case's ``sanitizer(tools=...)`` marker names (None: no
    marker, or a bare one, which means every tool)."""
    from gpucheck.sanitizer.command import TOOLS

    marker = item.get_closest_marker("sanitizer")
    if marker is None or "tools" not in marker.kwargs:
        return None
    tools = marker.kwargs["tools"]
    tools = (tools,) if isinstance(tools, str) else tuple(tools)
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown or not tools:
        raise pytest.UsageError(f"gpucheck: {item.nodeid}: sanitizer(tools=...) names unknown "
                                f"tool(s) {unknown or '(none)'}; known: {', '.join(TOOLS)}")
    return tools


def _deselect_other_tools(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a sanitizer pass (``--gpucheck-sanitizer-tool``), cases marked for other tools only
    are deselected (not skipped: they are not this pass's cases)."""
    tool = config.getoption("--gpucheck-sanitizer-tool", None)
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        tools = sanitizer_tools(item)  # validated in every worker, sanitizer pass or not
        (drop if tool and tools is not None and tool not in tools else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def unwatched(item: pytest.Item) -> list[str]:
    """The compiled extension modules and functions the test's ``gpucheck_unwatched``
    markers name (a bad marker is a usage error)."""
    from gpucheck.detectors import ext_watch

    try:
        return ext_watch.marker_names([m.args for m in item.iter_markers(ext_watch.MARKER)])
    except ValueError as err:
        raise pytest.UsageError(f"gpucheck: {item.nodeid}: {err}") from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Cases for other sanitizer tools leave a sanitizer pass. Tests of gpucheck's kernels on
    a GPU without the compiled extension: one usage error with the fix, not one failure (or
    skip) per case. A bad ``gpucheck_unwatched`` marker: a usage error before any test."""
    _deselect_other_tools(config, items)
    for item in items:
        unwatched(item)
    if not any(item.get_closest_marker(KERNELS_MARKER) for item in items):
        return
    if not target_devices(config):
        return  # no GPU: those cases are skipped for that reason
    from gpucheck.errors import ExtensionNotBuilt
    from gpucheck.ops import _ext

    try:
        _ext.load()
    except ExtensionNotBuilt as err:
        raise pytest.UsageError(f"gpucheck: {err}") from None


def _visible_cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def target_devices(config: pytest.Config) -> list[int]:
    """Indices of the devices the suite targets (validated against what is visible)."""
    chosen: list[int] | None = config.getoption("--gpucheck-device")
    if chosen is None and os.environ.get(DEVICES_ENV):
        chosen = [int(x) for x in os.environ[DEVICES_ENV].split(",") if x.strip()]
    count = _visible_cuda_count()
    if chosen is None:
        return list(range(count))
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise pytest.UsageError(
            f"gpucheck: target device(s) {bad} not visible; {count} CUDA device(s) visible"
        )
    return chosen


def xdist_worker(config: pytest.Config) -> str | None:
    """The xdist worker id (``gw0``...) of this process, or None outside an xdist worker
    (an inherited ``$PYTEST_XDIST_WORKER`` alone does not count)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return worker if worker and hasattr(config, "workerinput") else None


def pinned_device(worker: str, devices: list[int]) -> int:
    """The target device of xdist worker ``worker``: ``gwK`` -> ``devices[K % len]``."""
    if not devices:
        raise ValueError("no target device to pin an xdist worker to")
    m = re.fullmatch(r"gw(\d+)", worker)
    if m is None:
        raise pytest.UsageError(f"gpucheck: cannot pin xdist worker {worker!r} to a GPU "
                                "(expected an id like gw0)")
    return devices[int(m.group(1)) % len(devices)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gpu_device" not in metafunc.fixturenames:
        return
    devices = target_devices(metafunc.config)
    worker = xdist_worker(metafunc.config)
    if devices and worker is not None:
        # every worker must collect the same ids: the device is the worker's, not the id's
        metafunc.parametrize("gpu_device", [pinned_device(worker, devices)], ids=["gpu"],
                             indirect=True)
    elif devices:
        metafunc.parametrize("gpu_device", devices, ids=[f"cuda{i}" for i in devices],
                             indirect=True)
    else:
        metafunc.parametrize(
            "gpu_device",
            [pytest.param(None, marks=pytest.mark.skip(reason="no CUDA device visible"))],
            ids=["nocuda"],
            indirect=True,
        )


@pytest.fixture
def gpu_device(request: pytest.FixtureRequest) -> Any:
    """The target ``torch.device``; another device is current and initialized meanwhile
    (or, with ``GPUCHECK_CURRENT=target``, the target itself is current), and a non-default
    stream is current on the target (unless ``GPUCHECK_STREAM=default``)."""
    import torch

    from gpucheck.runner.poison import make_other_device_current, stream_made_current

    target = torch.device("cuda", request.param)
    current: str | None
    if os.environ.get(CURRENT_ENV) == "target":
        torch.cuda.set_device(target)
        current = str(target)
    else:
        other = make_other_device_current(target)
        current = None if other is None else str(other)
    request.node.user_properties.append(("gpucheck_current_device", current))
    if os.environ.get(STREAM_ENV) == "default":
        yield target
        return
    with stream_made_current(target) as stream:
        request.node.user_properties.append(("gpucheck_current_stream", repr(stream)))
        yield target


@pytest.fixture
def other_device(gpu_device: Any) -> Any:
    """The device made current while ``gpu_device`` is tested, or None (one device visible,
    or the target itself made current with ``GPUCHECK_CURRENT=target``)."""
    from gpucheck.runner.poison import other_device as _other

    if os.environ.get(CURRENT_ENV) == "target":
        return None

    return _other(gpu_device)


# --- findings a case attaches (gpucheck_findings, check_op) ----------------------------------

RECORDER = "gpucheck-recorder"
#: findings attached by the case under way: drained into its record after its teardown
_ATTACHED: list[Any] = []
#: the op the case under way checks (check_op): named on its findings that name none
_CASE_OP: list[str | None] = [None]
#: findings of finished cases, outside ``gpucheck run`` (terminal summary, exit status)
_REPORTED: list[dict[str, Any]] = []
#: findings of the detectors outside ``gpucheck run``, by node id
_PLAIN_FINDINGS: dict[str, list[Any]] = {}
FINDING_PROPERTY = "gpucheck_finding"


def attach(kind: str, message: str, *, severity: str = "error", op: str | None = None,
           kernel: str | None = None, evidence: str | None = None,
           hint: str | None = None) -> Any:
    """Attach a finding to the case under way (device, suite and case are filled in when it
    ends). Returns the :class:`~gpucheck.report.results.Finding`."""
    from gpucheck.report.results import Finding

    if severity not in ("error", "warning", "info"):
        raise ValueError(f"severity must be error, warning or info, got {severity!r}")
    if not kind or not message:
        raise ValueError("a finding needs a kind and a message")
    f = Finding(kind=kind, severity=severity, message=message, op=op, kernel=kernel,
                evidence=evidence, hint=hint)
    _ATTACHED.append(f)
    return f


def set_case_op(name: str | None) -> None:
    """Name the op the case under way checks: its findings that name no op get this one."""
    _CASE_OP[0] = name


def merge(existing: list[Any], attached: list[Any], op: str | None) -> list[Any]:
    """The attached findings to add to a case that already has ``existing`` (its detectors'):
    ``op`` is named on every finding that names none; an attached finding the detectors
    already made (same kind, op and message, or any device-state leak once one is there) is
    left out."""
    for f in (*existing, *attached):
        if f.op is None and op is not None:
            f.op = op
    keep = []
    for f in attached:
        if any(e.kind == f.kind and e.op == f.op and
               (e.message == f.message or f.kind == "device-state-leak") for e in existing):
            continue
        keep.append(f)
    return keep


class Findings:
    """The ``gpucheck_findings`` fixture: attach findings to this test's case record."""

    def __init__(self) -> None:
        self.attached: list[Any] = []

    def attach(self, kind: str, message: str, *, severity: str = "error",
               op: str | None = None, kernel: str | None = None, evidence: str | None = None,
               hint: str | None = None) -> Any:
        """A finding (``kind`` e.g. ``"numerics"``, ``severity`` error / warning / info)."""
        f = attach(kind, message, severity=severity, op=op, kernel=kernel, evidence=evidence,
                   hint=hint)
        self.attached.append(f)
        return f

    __call__ = attach


@pytest.fixture
def gpucheck_findings() -> Findings:
    """Attach findings to this test's record: ``gpucheck_findings.attach(kind, message,
    severity="error", op=..., evidence=..., hint=...)``."""
    return Findings()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    _ATTACHED.clear()
    _CASE_OP[0] = None
    from gpucheck.detectors import ext_watch

    ext_watch.begin_test(unwatched(item))  # and wraps extensions imported before the watch
    if _CONTEXT_LOST and _uses_cuda(item):
        case, error = _CONTEXT_LOST[0]
        item.user_properties.append((CONTEXT_LOST_PROPERTY, case))
        pytest.fail(f"not run: this process's CUDA context was lost in {case} ({error}); "
                    "every later CUDA call in the process fails the same way (gpucheck run "
                    "goes on in a fresh process)", pytrace=False)
    yield


# --- a CUDA context lost outside ``gpucheck run`` -----------------------------------------

#: outside ``gpucheck run``: (case, first line of the error) that lost this process's CUDA
#: context; the later tests that use CUDA fail in setup, "not run", instead of each failing
#: with the same error (and blaming whatever op it checks)
_CONTEXT_LOST: list[tuple[str, str]] = []
#: the not-run tests, by the case that lost the context (the controller's count under xdist)
_NOT_RUN: dict[str, int] = {}
CONTEXT_LOST_PROPERTY = "gpucheck_context_lost_in"


def _uses_cuda(item: pytest.Item) -> bool:
    return ("gpu_device" in getattr(item, "fixturenames", ()) or
            any(item.get_closest_marker(name) is not None for name in ("gpu", "multigpu")))


def sticky_cuda_error(err: BaseException) -> str | None:
    """The first line of a CUDA error that leaves the process's context unusable, in ``err``
    or the exceptions it was raised from, or None."""
    from gpucheck.errors import sticky_cuda_error_line

    messages: list[str] = []
    e: BaseException | None = err
    while e is not None and len(messages) < 32:  # a chain can loop
        messages.append(str(e))
        e = e.__cause__ or e.__context__
    return sticky_cuda_error_line("\n".join(messages))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    yield
    if (call.excinfo is None or _CONTEXT_LOST or
            item.config.pluginmanager.get_plugin(RECORDER) is not None):
        return  # under gpucheck run the recorder ends the worker and the harness goes on
    error = sticky_cuda_error(call.excinfo.value)
    if error is not None:
        _CONTEXT_LOST.append((item.nodeid, error))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Outside ``gpucheck run``: the worker-side detectors watch the body of every test that
    uses ``gpu_device`` (under the harness its recorder runs them)."""
    detectors = _plain_detectors(item)
    if not detectors:
        yield
        return
    from gpucheck.detectors import CaseInfo

    info = CaseInfo(str(getattr(item, "funcargs", {}).get("gpu_device")),
                    Path(item.path).parent.name,
                    item.nodeid)
    started = []
    for d in detectors:
        try:
            d.case_started(info)
            started.append(d)
        except Exception:  # a detector must never take a case down with it
            continue
    outcome = yield
    raised = outcome.excinfo
    # after a lost context every detector fails too: their errors would only repeat it
    lost = raised is not None and sticky_cuda_error(raised[1]) is not None
    found = _PLAIN_FINDINGS.setdefault(item.nodeid, [])
    for d in started:
        try:
            found.extend(d.case_finished(info))
        except Exception as err:
            if lost:
                continue
            from gpucheck.report.results import Finding

            found.append(Finding(kind="detector-error", severity="warning",
                                 message=f"detector {d.name} failed: {err!r}"))


def _plain_detectors(item: pytest.Item) -> list[Any]:
    config = item.config
    if config.pluginmanager.get_plugin(RECORDER) is not None:
        return []
    if getattr(item, "funcargs", {}).get("gpu_device") is None:
        return []
    if not hasattr(config, "_gpucheck_detectors"):
        from gpucheck.detectors import worker_detectors

        config._gpucheck_detectors = worker_detectors()  # type: ignore[attr-defined]
    return list(config._gpucheck_detectors)  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    yield  # fixtures (nvml_tracker) attach in their teardown too
    drain(item)
    from gpucheck.detectors import ext_watch

    ext_watch.set_unwatched()  # the test's marker ends with it


def drain(item: pytest.Item) -> None:
    """Hand the case's attached findings to its record (``gpucheck run``) or to the
    test's report (plain pytest: ``user_properties``, summed up at the end)."""
    attached, op = list(_ATTACHED), _CASE_OP[0]
    _ATTACHED.clear()
    _CASE_OP[0] = None
    rec = item.config.pluginmanager.get_plugin(RECORDER)
    if rec is not None:
        existing = rec.detector_findings.setdefault(item.nodeid, [])
        where = {"device": rec.device, "suite": rec.suite_of(Path(item.path).resolve()),
                 "case": rec.ids.get(item.nodeid, item.nodeid)}
        new = merge(existing, attached, op)
        for f in new:
            f.device, f.suite, f.case = where["device"], where["suite"], where["case"]
        existing.extend(new)
        return
    existing = _PLAIN_FINDINGS.pop(item.nodeid, [])
    device = getattr(item, "funcargs", {}).get("gpu_device")
    for f in [*existing, *merge(existing, attached, op)]:
        f.device = f.device or (None if device is None else str(device))
        f.suite, f.case = f.suite or Path(item.path).parent.name, item.nodeid
        item.user_properties.append((FINDING_PROPERTY, json.dumps(
            {k: v for k, v in f.__dict__.items() if v is not None})))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if key == FINDING_PROPERTY:
            _REPORTED.append(json.loads(value) if isinstance(value, str) else dict(value))  # type: ignore[call-overload]
        elif key == CONTEXT_LOST_PROPERTY and report.when == "setup":
            _NOT_RUN[str(value)] = _NOT_RUN.get(str(value), 0) + 1


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config
                            ) -> None:
    tr = terminalreporter
    if _NOT_RUN:
        tr.section("gpucheck: CUDA context lost")
    for case, n in _NOT_RUN.items():
        tr.line(f"{case} lost its process's CUDA context: {n} later test(s) of that process "
                "were not run (errors in setup). `gpucheck run` runs them in a fresh process.")
    if not _REPORTED:
        return
    tr.section("gpucheck findings")
    for f in _REPORTED:
        where = " ".join(x for x in (f.get("device"), f.get("op") and f"op {f['op']}") if x)
        tr.line(f"{f.get('severity', 'error').upper()} {f.get('kind')} [{where}] "
                f"{f.get('case')}: {f.get('message')}")
        if f.get("hint"):
            tr.line(f"    hint: {f['hint']}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Outside ``gpucheck run``, findings of severity error fail the session (exit 1) even
    when every test passed (a kernel on the wrong GPU that peer access let read right)."""
    if xdist_worker(session.config) is not None:
        return  # the controller sums up what its workers reported
    if exitstatus == 0 and any(f.get("severity") == "error" for f in _REPORTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- NVML memory of the test --------------------------------------------------------------

NVML_INTERVAL_ENV = "GPUCHECK_NVML_INTERVAL"


@pytest.fixture
def nvml_tracker(request: pytest.FixtureRequest) -> Any:
    """This process's GPU memory over the test (NVML): ``nvml_tracker.timeline``,
    ``nvml_tracker.peak(device)``; ``available`` False (values N/A) without NVML. The
    peaks go into the test's ``user_properties`` (``gpucheck_nvml_peak``)."""
    tracker = NvmlTracker(float(os.environ.get(NVML_INTERVAL_ENV, "0.01"))).start()
    yield tracker
    tracker.stop()
    request.node.user_properties.append(
        ("gpucheck_nvml_peak", tracker.peaks() if tracker.available else None))
