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

Target devices: ``--gpucheck-device N`` (repeatable) or ``GPUCHECK_DEVICES=0,1``; default: all
visible devices. Without a CUDA device, tests using ``gpu_device`` are skipped with a reason.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

MARKERS = {
    "gpu": "needs a CUDA device",
    "multigpu": "needs two or more CUDA devices",
    "sanitizer": "small enough to run under compute-sanitizer (memcheck slows launches ~37x); "
                 "sanitizer(tools=('racecheck', ...)): only in the passes of those tools",
    "slow": "takes long (soak tests, large sizes)",
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


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    config.addinivalue_line("markers", f"{KERNELS_MARKER}: tests gpucheck's own CUDA kernels "
                                       "(the run stops once, with the fix, if they are not built)")
    if config.getoption("--gpucheck-device"):
        target_devices(config)  # a bad index is a usage error before collection starts
    if config.getoption("--gpucheck-results"):
        from gpucheck.runner.worker import Recorder

        config.pluginmanager.register(Recorder(config), "gpucheck-recorder")


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Cases for other sanitizer tools leave a sanitizer pass. Tests of gpucheck's kernels on
    a GPU without the compiled extension: one usage error with the fix, not one failure (or
    skip) per case."""
    _deselect_other_tools(config, items)
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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gpu_device" not in metafunc.fixturenames:
        return
    devices = target_devices(metafunc.config)
    if devices:
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
