"""Typed Python wrappers of gpucheck's bundled CUDA kernels (``torch.ops.gpucheck.*``):
``gpucheck.ops.ssim``, ``gpucheck.ops.knn_mean_sq_dist``, ``gpucheck.ops.rasterize``, ...

Each name is one that a kernel's home exports from its ``op.py``
(``gpucheck/kernels/<kernel>/op.py``, its ``__all__``; :mod:`gpucheck.kernels`), imported on
first use: ``import gpucheck.ops`` imports neither torch nor the extension, which is loaded on
a wrapper's first call. A new kernel edits nothing here.
"""

from __future__ import annotations

from typing import Any

from gpucheck import kernels


def __getattr__(name: str) -> Any:
    return kernels.facade_attribute(__name__, "op", name)


def __dir__() -> list[str]:
    return kernels.facade_names(__name__, "op")
