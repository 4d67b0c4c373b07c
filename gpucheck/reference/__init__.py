"""Pure-PyTorch implementations of gpucheck's kernels, used as oracles (CPU and GPU).

Submodules are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ssim": "gpucheck.reference.ssim",
    "knn_mean_sq_dist": "gpucheck.reference.knn",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
