"""Typed Python wrappers of gpucheck's reference CUDA kernels (``torch.ops.gpucheck.*``).

Importing works without the compiled extension; it is loaded on the first call. The wrappers
(and torch with them) are imported on first use: the harness reads ``gpucheck.ops._ext``
(whether the kernels load, checked in a child) without paying for a torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucheck.ops.knn import knn_mean_sq_dist
    from gpucheck.ops.splat import rasterize
    from gpucheck.ops.ssim_op import ssim

#: each public name and the module that defines it
_HOMES = {
    "knn_mean_sq_dist": "gpucheck.ops.knn",
    "rasterize": "gpucheck.ops.splat",
    "ssim": "gpucheck.ops.ssim_op",
}

__all__ = ["knn_mean_sq_dist", "rasterize", "ssim"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gpucheck.ops' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
