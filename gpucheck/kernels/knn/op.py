"""Exact k-nearest-neighbour mean squared distance (``torch.ops.gpucheck.knn_mean_sq_dist``).

The drop-in for simple-knn's ``distCUDA2`` that 3D Gaussian splatting uses to initialise every
Gaussian's scale (failure 2 of ``docs/failures.md``), with a scoped device guard instead of a
``cudaSetDevice`` that leaks: the caller's current device is unchanged afterwards.

This module imports without the compiled extension; the extension is loaded (and the fake
implementation registered) on first use.
"""

from __future__ import annotations

import functools

import torch

from gpucheck._csrc.extension import registered_op

#: the names gpucheck.ops exports of this kernel (gpucheck/kernels/__init__.py)
__all__ = ["knn_mean_sq_dist"]

#: Largest supported ``k`` (the per-point top-k lives in registers).
MAX_K = 16
_QUALNAME = "gpucheck::knn_mean_sq_dist"


def _fake(points: torch.Tensor, k: int = 3) -> torch.Tensor:
    """Shape-only implementation for torch.compile / FakeTensor: ``[N]`` float32."""
    torch._check(
        points.dim() == 2 and points.shape[1] == 3,
        lambda: f"knn_mean_sq_dist: points must be [N, 3], got {list(points.shape)}",
    )
    torch._check(1 <= k <= MAX_K, lambda: f"knn_mean_sq_dist: k must be in [1, {MAX_K}], got {k}")
    return points.new_empty((points.shape[0],), dtype=torch.float32)


@functools.cache
def op() -> torch._ops.OpOverload:
    """The registered op (loads the extension and registers its fake implementation once).

    Raises:
        gpucheck.errors.ExtensionNotBuilt: the compiled extension is not installed.
    """
    return registered_op(_QUALNAME, _fake)


def knn_mean_sq_dist(points: torch.Tensor, k: int = 3) -> torch.Tensor:
    """Mean squared Euclidean distance from each point to its ``k`` nearest *other* points.

    Exact (not approximate): the result is the mean of the ``k`` smallest float32 squared
    distances ``|p_i - p_j|^2`` (``j != i``), computed from coordinate differences, so large
    coordinate offsets do not cancel precision away. Duplicated points give 0. A squared
    distance beyond the float32 range (points about 1.8e19 or more apart, e.g. coordinates of
    +-3e38) is +inf, and so is a result whose float32 sum of the k smallest overflows. Built on
    the GPU from a Morton-ordered box tree (clouds with far outliers get a grid per distance
    class, so the dense core keeps its resolution); about linear in N. The environment variable
    ``GPUCHECK_KNN_WALK_BUDGET`` (tuning and tests only) sets how many tree-walk steps a warp of
    32 queries takes before its queries run one per warp; it changes the speed, never the
    result. Not differentiable (like ``distCUDA2``):
    the result carries no gradient. The call synchronises the current stream once (to check the
    input for NaN/inf), so it cannot be captured in a CUDA graph.

    Args:
        points: ``[N, 3]`` float32, contiguous, on a CUDA device, all coordinates finite,
            ``N > k``. Runs on ``points.device``; the current device is left as it was.
        k: number of neighbours, ``1 <= k <= 16`` (3DGS uses 3).

    Returns:
        ``[N]`` float32 on ``points.device``.

    Raises:
        TypeError: ``points`` is not a tensor, is not float32, or ``k`` is not an int.
        ValueError: ``points`` is not a CUDA tensor, not ``[N, 3]``, not contiguous, holds NaN
            or inf, or ``N <= k``; ``k`` is out of range.
        gpucheck.errors.ExtensionNotBuilt: the compiled extension is not installed.
    """
    _check_python_side(points, k)
    # Shape, dtype, contiguity, k, N and NaN/inf are checked by the C++ entry point, so that
    # callers of torch.ops.gpucheck.knn_mean_sq_dist get the same clear errors.
    return op()(points, k)


def _check_python_side(points: torch.Tensor, k: int) -> None:
    """What the C++ entry point cannot say as well: wrong types, and a CPU tensor."""
    if not isinstance(points, torch.Tensor):
        raise TypeError(f"knn_mean_sq_dist: points must be a torch.Tensor, got {type(points)}")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"knn_mean_sq_dist: k must be an int, got {k!r}")
    if points.device.type != "cuda":
        raise ValueError(
            f"knn_mean_sq_dist: points must be a CUDA tensor, got one on {points.device} "
            "(gpucheck.reference.knn_mean_sq_dist is the CPU implementation)"
        )
