"""Pure-PyTorch oracle for ``gpucheck.ops.knn_mean_sq_dist``: brute force in chunks, float64.

Distances are computed per axis from coordinate *differences* in float64 (never with the
``|a|^2 + |b|^2 - 2 a.b`` expansion that ``cdist``/matmul use, which loses all precision for
clouds far from the origin, e.g. 1e4 + small noise). Works on CPU and GPU; O(N^2) work, so it
is meant for tests and spot checks.
"""

from __future__ import annotations

import torch

#: the names gpucheck.reference exports of this kernel (gpucheck/kernels/__init__.py)
__all__ = ["knn_mean_sq_dist"]

#: Elements of one chunk's [rows, N] float64 distance matrix (2^24 * 8 bytes = 128 MiB).
DEFAULT_CHUNK_ELEMENTS = 1 << 24


def _check(points: torch.Tensor, k: int) -> None:
    if not isinstance(points, torch.Tensor):
        raise TypeError(f"knn_mean_sq_dist: points must be a torch.Tensor, got {type(points)}")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"knn_mean_sq_dist: k must be an int, got {k!r}")
    if points.dim() != 2 or points.shape[1] != 3:
        raise ValueError(f"knn_mean_sq_dist: points must be [N, 3], got {list(points.shape)}")
    if not points.is_floating_point():
        raise TypeError(f"knn_mean_sq_dist: points must be floating point, got {points.dtype}")
    if k < 1:
        raise ValueError(f"knn_mean_sq_dist: k must be >= 1, got {k}")
    n = points.shape[0]
    if n <= k:
        raise ValueError(
            f"knn_mean_sq_dist: needs more than k points (each point has k neighbours other "
            f"than itself), got N = {n} with k = {k}"
        )
    finite = torch.isfinite(points).all(dim=1)
    if not bool(finite.all()):
        row = int((~finite).nonzero()[0, 0])
        raise ValueError(
            f"knn_mean_sq_dist: points must be finite, but row {row} is "
            f"{tuple(points[row].tolist())}"
        )


def knn_mean_sq_dist(
    points: torch.Tensor,
    k: int = 3,
    *,
    rows: torch.Tensor | None = None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Mean squared distance from each point to its ``k`` nearest other points (exact).

    Args:
        points: ``[N, 3]`` floating point (any device), finite, ``N > k``.
        k: number of neighbours, ``k >= 1`` (the CUDA op supports up to 16).
        rows: optional ``[M]`` int64 indices into ``points``: compute only these points' values
            (against all N points), for spot checks of large clouds.
        chunk_elements: bound on the elements of one chunk's distance matrix.

    Returns:
        ``[N]`` (or ``[M]``) float64 on ``points.device``: the exact mean of the ``k``
        smallest squared distances of the given (upcast) coordinates, to float64 rounding.

    Raises:
        TypeError: ``points`` is not a floating-point tensor or ``k`` is not an int.
        ValueError: wrong shape, ``k < 1``, ``N <= k``, or NaN/inf coordinates.
    """
    _check(points, k)
    p = points.detach().to(torch.float64)
    n = p.shape[0]
    if rows is None:
        rows = torch.arange(n, device=p.device)
    rows = rows.to(device=p.device, dtype=torch.long)
    out = torch.empty(rows.shape[0], dtype=torch.float64, device=p.device)
    step = max(1, chunk_elements // n)
    for start in range(0, rows.shape[0], step):
        idx = rows[start : start + step]
        q = p[idx]  # [C, 3]
        d = (q[:, 0:1] - p[:, 0]).square_()  # [C, N]
        d += (q[:, 1:2] - p[:, 1]).square_()
        d += (q[:, 2:3] - p[:, 2]).square_()
        d[torch.arange(idx.shape[0], device=p.device), idx] = float("inf")  # not itself
        out[start : start + step] = d.topk(k, dim=1, largest=False, sorted=False).values.mean(1)
    return out
