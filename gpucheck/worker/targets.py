"""Which CUDA devices a suite targets in this process: ``--gpucheck-device N`` (repeatable)
or ``$GPUCHECK_DEVICES``, else every visible device; under ``pytest -n N`` each xdist worker
is pinned to one of them."""

from __future__ import annotations

import os
import re

import pytest

from gpucheck.model.contract import DEVICES_ENV


def visible_cuda_count() -> int:
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
    count = visible_cuda_count()
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
        raise pytest.UsageError(
            f"gpucheck: cannot pin xdist worker {worker!r} to a GPU (expected an id like gw0)"
        )
    return devices[int(m.group(1)) % len(devices)]


def parametrize_devices(metafunc: pytest.Metafunc) -> None:
    """``gpu_device`` once per target device (``[cudaK]``), ``[gpu]`` under xdist (every
    worker must collect the same ids: the device is the worker's, not the id's), or one
    skipped ``[nocuda]`` case without a GPU (a ``[cpu]`` case for a ``check_op`` battery,
    which then checks the suite itself)."""
    devices = target_devices(metafunc.config)
    worker = xdist_worker(metafunc.config)
    if devices and worker is not None:
        metafunc.parametrize(
            "gpu_device", [pinned_device(worker, devices)], ids=["gpu"], indirect=True
        )
    elif devices:
        metafunc.parametrize(
            "gpu_device", devices, ids=[f"cuda{i}" for i in devices], indirect=True
        )
    elif getattr(metafunc.function, "gpucheck_op", None) is not None:
        # a check_op battery: its cases check the suite itself on CPU (gpucheck.check.cpu)
        metafunc.parametrize("gpu_device", [None], ids=["cpu"], indirect=True)
    else:
        metafunc.parametrize(
            "gpu_device",
            [pytest.param(None, marks=pytest.mark.skip(reason="no CUDA device visible"))],
            ids=["nocuda"],
            indirect=True,
        )
