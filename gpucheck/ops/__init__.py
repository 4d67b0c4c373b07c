"""Typed Python wrappers of gpucheck's reference CUDA kernels (``torch.ops.gpucheck.*``).

Submodules are imported on first use so that ``import gpucheck.ops`` stays cheap and works
without the compiled extension.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ssim": "gpucheck.ops.ssim",
    "knn_mean_sq_dist": "gpucheck.ops.knn",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
