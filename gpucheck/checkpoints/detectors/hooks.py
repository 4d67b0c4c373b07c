"""The checkpoint detectors' hook module: the entry point ``checkpoints`` in group
``gpucheck`` (pyproject.toml) names it, as a third party's package names its own."""

from __future__ import annotations

from gpucheck.checkpoints.detectors.checkpoint_reads import CheckpointReads
from gpucheck.checkpoints.detectors.double_activation import DoubleActivation
from gpucheck.detectors.base import Detector
from gpucheck.detectors.registry import hookimpl
from gpucheck.model.kinds import Kind


@hookimpl
def gpucheck_worker_detectors() -> list[Detector]:
    """Fresh checkpoint detectors for one worker process."""
    return [DoubleActivation(), CheckpointReads()]


@hookimpl
def gpucheck_finding_kinds() -> list[Kind]:
    """The kinds of finding the checkpoint detectors declare."""
    return [*DoubleActivation.kinds, *CheckpointReads.kinds]
