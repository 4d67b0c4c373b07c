"""Pure-PyTorch implementations of gpucheck's kernels, used as oracles (CPU and GPU):
``gpucheck.reference.ssim``, ``gpucheck.reference.knn_mean_sq_dist``,
``gpucheck.reference.rasterize`` (and its ``RasterizeResult``), ...

Each name is one that a kernel's home exports from its ``reference.py``
(``gpucheck/kernels/<kernel>/reference.py``, its ``__all__``; :mod:`gpucheck.kernels`),
imported on first use. A new kernel edits nothing here.
"""

from __future__ import annotations

from typing import Any

from gpucheck import kernels


def __getattr__(name: str) -> Any:
    return kernels.facade_attribute(__name__, "reference", name)


def __dir__() -> list[str]:
    return kernels.facade_names(__name__, "reference")
