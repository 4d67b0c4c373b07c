"""The checkpoint detectors: 3DGS checkpoints saved after activation (``double-activation``)
and the checkpoints a case reads, linted as it reads them (``checkpoint-reads``).

They belong to the checkpoint wing, not to the toolkit: gpucheck registers them the way
another package registers its own, through the ``gpucheck`` entry point group
(``pyproject.toml`` names :mod:`gpucheck.checkpoints.detectors.hooks`).
"""

from __future__ import annotations

from gpucheck.checkpoints.detectors.checkpoint_reads import CheckpointReads
from gpucheck.checkpoints.detectors.double_activation import DoubleActivation

__all__ = ["CheckpointReads", "DoubleActivation"]
