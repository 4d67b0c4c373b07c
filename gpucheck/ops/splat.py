"""Tile-based 3D Gaussian splatting rasterizer on CUDA (``torch.ops.gpucheck.splat_forward``).

The kernel (csrc/splat) renders the same image as :func:`gpucheck.reference.rasterize`, the
float64 oracle whose module docstring fixes every convention (camera, pixel centres, near
plane, Jacobian clamp, low-pass, radius, tiles, compositing, SH). Before it allocates its
binning buffers it counts the Gaussian-tile overlaps and raises
:class:`gpucheck.errors.BudgetExceeded` when they would not fit ``max_bytes`` or the free
device memory (failure 3 of ``docs/failures.md``: scales activated twice).

This is the forward pass only: the result carries no gradient yet, and the per-Gaussian
fields of the reference's result that the kernel does not return yet (``means2d``, ``depths``,
``conics``, ``colors``, ``tiles``) are ``None``.

This module imports without the compiled extension; it is loaded on first call.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch

from gpucheck.errors import BudgetExceeded
from gpucheck.ops._ext import registered_op
from gpucheck.reference.splat import BYTES_PER_INTERSECTION, sh_degree_of

__all__ = ["BYTES_PER_INTERSECTION", "RasterizeResult", "op", "rasterize"]

_QUALNAME = "gpucheck::splat_forward"
#: How the C++ entry point starts the message of a failed preflight (a torch.OutOfMemoryError,
#: which :func:`rasterize` turns into BudgetExceeded).
BUDGET_PREFIX = "splat_forward: binning budget exceeded: "


class RasterizeResult(NamedTuple):
    """What :func:`rasterize` returns: the fields of the reference's result, in its order."""

    image: torch.Tensor                  #: [3, H, W] float32, background included
    alpha: torch.Tensor                  #: [H, W] float32, 1 - final transmittance
    depth: torch.Tensor                  #: [H, W] float32 expected depth (0 where alpha is 0)
    radii: torch.Tensor                  #: [N] int32 pixel radius, 0 for culled Gaussians
    means2d: torch.Tensor | None = None  #: not returned by the forward kernel yet
    depths: torch.Tensor | None = None   #: not returned yet
    conics: torch.Tensor | None = None   #: not returned yet
    colors: torch.Tensor | None = None   #: not returned yet
    tiles: torch.Tensor | None = None    #: not returned yet
    n_intersections: int = 0             #: sum over Gaussians of the tiles they touch


def _fake(means: torch.Tensor, scales: torch.Tensor, rotations: torch.Tensor,
          opacities: torch.Tensor, colors: torch.Tensor, viewmat: torch.Tensor, K: torch.Tensor,
          background: torch.Tensor, width: int, height: int, sh_degree: int,
          max_bytes: int | None = None) -> tuple[torch.Tensor, ...]:
    """Shape-only implementation for torch.compile / FakeTensor."""
    torch._check(means.dim() == 2 and means.shape[1] == 3,
                 lambda: f"splat_forward: means must be [N, 3], got {list(means.shape)}")
    torch._check(width >= 1 and height >= 1,
                 lambda: f"splat_forward: width and height must be >= 1, got {width}x{height}")
    n = means.shape[0]
    return (means.new_empty((3, height, width)), means.new_empty((height, width)),
            means.new_empty((height, width)), means.new_empty((n,), dtype=torch.int32),
            means.new_empty((), dtype=torch.int64))


@functools.cache
def op() -> torch._ops.OpOverload:
    """The registered op (loads the extension and registers its fake implementation once).

    Raises:
        gpucheck.errors.ExtensionNotBuilt: the compiled extension is not installed.
    """
    return registered_op(_QUALNAME, _fake)


def rasterize(
    means: torch.Tensor,
    scales: torch.Tensor,
    rotations: torch.Tensor,
    opacities: torch.Tensor,
    *,
    colors: torch.Tensor | None = None,
    sh: torch.Tensor | None = None,
    sh_degree: int | None = None,
    viewmat: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
    background: torch.Tensor | None = None,
    max_bytes: int | None = None,
) -> RasterizeResult:
    """Render Gaussians into one image on their CUDA device (forward only, float32).

    Same arguments and conventions as :func:`gpucheck.reference.rasterize`. Inputs are
    *activated* values (positive scales, opacities in ``[0, 1]``); all tensors float32,
    contiguous, on one CUDA device. Runs on ``means.device`` whatever device is current, on the
    current stream, and synchronises that stream once (to read the number of tile overlaps
    before the binning buffers are allocated). Deterministic: the same inputs give the same
    bits on every run.

    Args:
        means: ``[N, 3]`` world-space centres.
        scales: ``[N, 3]`` standard deviations along the Gaussian's axes, ``> 0``.
        rotations: ``[N, 4]`` quaternions ``(w, x, y, z)``, any non-zero norm.
        opacities: ``[N]`` in ``[0, 1]``.
        colors: ``[N, 3]`` precomputed RGB; exclusive with ``sh``.
        sh: ``[N, K, 3]`` SH coefficients (``K >= (d + 1)^2``, dc first); exclusive with
            ``colors``.
        sh_degree: degree to evaluate (0..3, at most what ``sh`` holds); default: all of ``sh``.
        viewmat: ``[4, 4]`` world-to-camera matrix (column-vector form, OpenCV axes).
        K: ``[3, 3]`` pinhole intrinsics ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``.
        width: image width in pixels (1 to 65536).
        height: image height in pixels (1 to 65536).
        background: ``[3]`` colour behind everything; default black.
        max_bytes: if given, raise :class:`BudgetExceeded` when the binning buffers
            (``BYTES_PER_INTERSECTION`` per Gaussian-tile overlap) would exceed it.

    Returns:
        :class:`RasterizeResult` with ``image``, ``alpha``, ``depth`` (float32), ``radii``
        (int32) on ``means.device`` and ``n_intersections``; the other fields are ``None``.

    Raises:
        TypeError: an input is not a tensor, not float32, or an int argument is not an int.
        ValueError: wrong shapes or devices, NaN/inf, non-activated values, a bad camera.
        BudgetExceeded: the binning buffers exceed ``max_bytes`` or the free device memory;
            the message lists N, the visible count, the overlaps, the bytes, the radius
            percentiles, the share of huge Gaussians and a hint.
        gpucheck.errors.ExtensionNotBuilt: the compiled extension is not installed.
    """
    degree = _check_python_side(means, scales, rotations, opacities, colors, sh, sh_degree,
                                viewmat, K, width, height, background, max_bytes)
    if background is None:
        background = torch.zeros(3, dtype=torch.float32, device=means.device)
    values = colors if degree < 0 else sh
    try:
        image, alpha, depth, radii, n_isect = op()(
            means, scales, rotations, opacities, values, viewmat, K, background, width, height,
            degree, max_bytes)
    except torch.OutOfMemoryError as err:
        msg = str(err).split("\nException raised from")[0]
        if BUDGET_PREFIX in msg:
            raise BudgetExceeded(msg[msg.index(BUDGET_PREFIX):]) from None
        raise
    return RasterizeResult(image=image, alpha=alpha, depth=depth, radii=radii,
                           n_intersections=int(n_isect))


def _check_python_side(
    means: Any, scales: Any, rotations: Any, opacities: Any, colors: Any, sh: Any,
    sh_degree: Any, viewmat: Any, K: Any, width: Any, height: Any, background: Any,
    max_bytes: Any,
) -> int:
    """What the C++ entry point cannot say as well (types, CPU tensors, colours vs SH);
    returns the SH degree to pass (-1 for RGB colours). Shapes, dtypes, contiguity and values
    are checked by the entry point, so that torch.ops callers get the same errors."""
    named = {"means": means, "scales": scales, "rotations": rotations, "opacities": opacities,
             "viewmat": viewmat, "K": K, "colors": colors, "sh": sh, "background": background}
    for name, t in named.items():
        if t is None and name in ("colors", "sh", "background"):
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rasterize: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"rasterize: {name} must be an int, got {v!r}")
        if v < 1:
            raise ValueError(f"rasterize: {name} must be a positive int, got {v!r}")
    if max_bytes is not None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
            raise TypeError(f"rasterize: max_bytes must be None or an int, got {max_bytes!r}")
        if max_bytes < 0:
            raise ValueError(f"rasterize: max_bytes must be None or >= 0, got {max_bytes!r}")
    degree = sh_degree_of(colors, sh, sh_degree)
    for name, t in named.items():
        if t is not None and t.device.type != "cuda":
            raise ValueError(
                f"rasterize: {name} must be a CUDA tensor, got one on {t.device} "
                "(gpucheck.reference.rasterize is the CPU implementation)")
    return degree
