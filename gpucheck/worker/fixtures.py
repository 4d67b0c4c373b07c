"""The fixtures suites use: ``gpu_device``, ``other_device``, ``gpucheck_findings``,
``nvml_tracker`` (registered by :mod:`gpucheck.pytest_plugin`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from gpucheck.model.contract import (
    CURRENT_DEVICE_PROPERTY,
    CURRENT_ENV,
    CURRENT_STREAM_PROPERTY,
    NVML_INTERVAL_ENV,
    NVML_PEAK_PROPERTY,
    STREAM_ENV,
    TARGET_CURRENT,
)
from gpucheck.nvml_sampler import NvmlTracker
from gpucheck.worker.case import Findings


@pytest.fixture
def gpu_device(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The target ``torch.device``; another device is current and initialized meanwhile
    (or, with ``GPUCHECK_CURRENT=target``, the target itself is current), and a non-default
    stream is current on the target (unless ``GPUCHECK_STREAM=default``)."""
    import torch

    from gpucheck.worker.poison import make_other_device_current, stream_made_current

    if request.param is None:  # no CUDA device: a check_op battery's dry run on CPU
        yield None
        return
    target = torch.device("cuda", request.param)
    current: str | None
    if os.environ.get(CURRENT_ENV) == TARGET_CURRENT:
        torch.cuda.set_device(target)
        current = str(target)
    else:
        other = make_other_device_current(target)
        current = None if other is None else str(other)
    request.node.user_properties.append((CURRENT_DEVICE_PROPERTY, current))
    if os.environ.get(STREAM_ENV) == "default":
        yield target
        return
    with stream_made_current(target) as stream:
        request.node.user_properties.append((CURRENT_STREAM_PROPERTY, repr(stream)))
        yield target


@pytest.fixture
def other_device(gpu_device: Any) -> Any:
    """The device made current while ``gpu_device`` is tested, or None (one device visible,
    or the target itself made current with ``GPUCHECK_CURRENT=target``)."""
    from gpucheck.worker.poison import other_device as _other

    if gpu_device is None or os.environ.get(CURRENT_ENV) == TARGET_CURRENT:
        return None
    return _other(gpu_device)


@pytest.fixture
def gpucheck_findings() -> Findings:
    """Attach findings to this test's record: ``gpucheck_findings.attach(kind, message,
    severity="error", op=..., evidence=..., hint=...)``."""
    return Findings()


@pytest.fixture
def nvml_tracker(request: pytest.FixtureRequest) -> Iterator[NvmlTracker]:
    """This process's GPU memory over the test (NVML): ``nvml_tracker.timeline``,
    ``nvml_tracker.peak(device)``; ``available`` False (values N/A) without NVML. The
    peaks go into the test's ``user_properties`` (``gpucheck_nvml_peak``)."""
    tracker = NvmlTracker(float(os.environ.get(NVML_INTERVAL_ENV, "0.01"))).start()
    yield tracker
    tracker.stop()
    request.node.user_properties.append(
        (NVML_PEAK_PROPERTY, tracker.peaks() if tracker.available else None)
    )
