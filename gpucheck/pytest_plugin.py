"""gpucheck's pytest plugin (entry point ``pytest11``): options, markers and hooks only.

Each hook hands its work to the worker side (:mod:`gpucheck.worker`); the fixtures live in
:mod:`gpucheck.worker.fixtures`.

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

from collections.abc import Generator
from typing import Any

import pytest

from gpucheck import _distribution
from gpucheck.detectors import ext_watch
from gpucheck.model.modes import BARE
from gpucheck.worker import case as case_mod
from gpucheck.worker import guard
from gpucheck.worker import recorder as recorder_mod
from gpucheck.worker.targets import parametrize_devices, target_devices

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
#: marks the tests of gpucheck's own kernels (our suites); not needed in users' suites
KERNELS_MARKER = "gpucheck_kernels"
#: the fixtures (gpucheck.worker.fixtures) and the ``dist_rank`` fixture of distributed cases
#: (gpucheck run --distributed, torchrun)
pytest_plugins = ("gpucheck.worker.fixtures", "gpucheck.distributed.fixtures")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpucheck")
    group.addoption(
        "--gpucheck-device",
        action="append",
        type=int,
        default=None,
        metavar="N",
        help="target CUDA device index (repeatable; default: $GPUCHECK_DEVICES or all visible)",
    )
    # the worker's options under `gpucheck run` (the controller passes them)
    group.addoption("--gpucheck-results", default=None, help="append case records here")
    group.addoption("--gpucheck-state", default=None, help="worker state file (harness)")
    group.addoption(
        "--gpucheck-wait-header",
        action="store_true",
        help="append no record before the results file holds the run's header (the "
        "controller writes it after starting the worker)",
    )
    group.addoption("--gpucheck-run-id", default="adhoc")
    group.addoption("--gpucheck-mode", default=BARE)
    group.addoption("--gpucheck-device-uuid", default=None)
    group.addoption(
        "--gpucheck-suite",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="name of the suite rooted at PATH (for records)",
    )
    group.addoption(
        "--gpucheck-nvml-interval",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="sample this process's GPU memory with NVML (0: off)",
    )
    group.addoption(
        "--gpucheck-sanitizer-log",
        default=None,
        metavar="TEMPLATE",
        help="compute-sanitizer --log-file of this run (%%p = pid)",
    )
    group.addoption("--gpucheck-sanitizer-tool", default=None)
    group.addoption(
        "--gpucheck-skip",
        default=None,
        metavar="FILE",
        help="deselect the node ids listed in FILE (already recorded cases)",
    )
    group.addoption(
        "--gpucheck-again",
        default=None,
        metavar="FILE",
        help="run the case ids listed in FILE without recording them (a distributed rank "
        "recorded them already; its peers need it in them)",
    )
    group.addoption(
        "--gpucheck-only",
        default=None,
        metavar="FILE",
        help="run only the case ids listed in FILE (the wrong-device re-run)",
    )
    group.addoption(
        "--gpucheck-shard",
        default=None,
        metavar="FILE",
        help="run only this shard's cases (the shard plan gpucheck run --shard writes)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Watch compiled extensions before the first conftest imports one."""
    ext_watch.install_unless_disabled()


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--gpucheck-results"):  # a worker: its controller checked
        problem = _distribution.conflict()
        if problem is not None:
            raise pytest.UsageError(f"gpucheck: {problem}")
    ext_watch.install_unless_disabled()  # no-op when pytest_load_initial_conftests did it
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    config.addinivalue_line(
        "markers",
        f"{KERNELS_MARKER}: tests gpucheck's own CUDA kernels "
        "(the run stops once, with the fix, if they are not built)",
    )
    if config.getoption("--gpucheck-device"):
        target_devices(config)  # a bad index is a usage error before collection starts
    if config.getoption("--gpucheck-results"):
        guard.tolerate_undecodable_output()
        config.pluginmanager.register(recorder_mod.Recorder(config), case_mod.RECORDER)
    case_mod.reset()


def sanitizer_tools(item: pytest.Item) -> tuple[str, ...] | None:
    """The compute-sanitizer tools a case's ``sanitizer(tools=...)`` marker names (None: no
    marker, or a bare one, which means every tool)."""
    from gpucheck.model.modes import SANITIZER_TOOLS as TOOLS

    marker = item.get_closest_marker("sanitizer")
    if marker is None or "tools" not in marker.kwargs:
        return None
    tools = marker.kwargs["tools"]
    tools = (tools,) if isinstance(tools, str) else tuple(tools)
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown or not tools:
        raise pytest.UsageError(
            f"gpucheck: {item.nodeid}: sanitizer(tools=...) names unknown "
            f"tool(s) {unknown or '(none)'}; known: {', '.join(TOOLS)}"
        )
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
    from gpucheck._csrc import extension
    from gpucheck.errors import ExtensionNotBuilt

    try:
        extension.load()
    except ExtensionNotBuilt as err:
        raise pytest.UsageError(f"gpucheck: {err}") from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gpu_device" in metafunc.fixturenames:
        parametrize_devices(metafunc)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, None]:
    case_mod.setup(item, unwatched(item))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    yield
    case_mod.made_report(item, call)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    yield from case_mod.watch_plain(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, Any, None]:
    yield  # fixtures (nvml_tracker) attach in their teardown too
    case_mod.drain(item)
    ext_watch.set_unwatched()  # the test's marker ends with it


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    case_mod.logreport(report)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    case_mod.terminal_summary(terminalreporter)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    case_mod.session_finish(session)
