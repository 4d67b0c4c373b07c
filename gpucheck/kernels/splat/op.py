"""Tile-based 3D Gaussian splatting rasterizer on CUDA, differentiable.

The kernels (csrc/splat) render the same image as :func:`gpucheck.reference.rasterize`, the
float64 oracle whose module docstring fixes every convention (camera, pixel centres, near
plane, Jacobian clamp, low-pass, radius, tiles, compositing, SH), and compute the same
gradients. Two ops, each with a backward op and a fake implementation, as in gsplat:

* ``torch.ops.gpucheck.splat_project``: per Gaussian screen mean, conic, colour, depth, radius,
  tile rectangle, then the tile binning (sorted Gaussian ids and per-tile ranges). Before it
  allocates its binning buffers it counts the Gaussian-tile overlaps and raises
  :class:`gpucheck.MemoryAnomalyError` (a :class:`gpucheck.errors.BudgetExceeded`) when they
  would not fit ``max_bytes`` or the free device memory (failure 3 of ``docs/failures.md``:
  scales activated twice), with the evidence as attributes.
* ``torch.ops.gpucheck.splat_render``: per tile compositing; it also returns each pixel's final
  transmittance and the position of its last contribution, which its backward walks back from.

**Screen-space mean gradient (densification).** ``rasterize`` returns the projected means as
``result.means2d``, an intermediate of the graph whose gradient it retains (like the
reference): after ``loss.backward()``, ``result.means2d.grad`` is ``d loss / d means2d`` in
pixels, ``[N, 2]``, zero for Gaussians that touched no pixel. This is what 3DGS reads from its
``viewspace_points.grad[:, :2]`` (3DGS's is in NDC units, i.e. scaled by ``2 / W`` and
``2 / H``) and accumulates per Gaussian to decide where to densify.

**Gradients.** ``means``, ``scales``, ``rotations``, ``opacities``, ``colors`` / ``sh`` and
``background`` get gradients; ``viewmat`` and ``K`` do not (camera optimisation is out of
scope). Losses may use ``image``, ``alpha`` and ``depth``, and also ``means2d``, ``depths`` and
``colors`` of the result; a gradient on ``conics`` of a Gaussian with radius 0 is dropped (the
kernel returns zeros there, the reference the conic it computed anyway). Gradients are
accumulated with float atomics, so they are reproducible to rounding, not bitwise; the forward
is bitwise deterministic. The environment variable ``GPUCHECK_SPLAT_BACKWARD_PIXELS`` (2 or 4;
tuning and tests only) sets how many pixels each thread of the render backward walks; it
changes the speed and the summation order, nothing else.

**Half precision.** The Gaussian parameters (``means``, ``scales``, ``rotations``,
``opacities``, ``colors`` / ``sh``, ``background``) are all float32, all bfloat16 or all
float16 (:data:`PARAMETER_DTYPES`; a mix is a TypeError naming the tensors); ``viewmat`` and
``K`` are float32 always. The projection reads 16-bit parameters directly and computes in
float32 / float64 exactly as for float32 ones, so the same values give the same bits. What it
returns per Gaussian in screen space (``means2d``, ``conics``, ``colors``, ``depths``) and per
pixel (``image``, ``alpha``, ``depth``) is **float32 whatever the parameters' dtype**: pixel
coordinates in bfloat16 would be off by whole pixels at 1080p, and the compositing and its
backward are float32 only. Gradients reach each parameter in its own dtype: computed in
float32 (the opacities' and background's summed with float32 atomics) and rounded once, when
stored. A float16 gradient is subject to float16's range (above 65504 it is inf, below ~6e-8
it is 0): scale the loss as torch.amp's GradScaler does when that matters; bfloat16 has
float32's range. Measured errors against the float64 reference: ``suites/splat`` and
``benchmarks/splat_tolerances.py --dtype``.

This module imports without the compiled extension; it is loaded on first call.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from gpucheck._csrc.extension import registered_op
from gpucheck.errors import MemoryAnomalyError
from gpucheck.kernels.splat.reference import (
    TILE_SIZE,
    RasterizeResult,
    sh_degree_of,
)

#: the names gpucheck.ops exports of this kernel (gpucheck/kernels/__init__.py)
__all__ = ["rasterize"]

#: The dtypes the Gaussian parameters may have (all of them the same one).
PARAMETER_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: The parameters that share one dtype, in the order the errors name them.
_PARAMETERS = ("means", "scales", "rotations", "opacities", "colors", "sh", "background")

#: How the C++ entry point starts the message of a failed preflight (a torch.OutOfMemoryError,
#: which :func:`rasterize` turns into MemoryAnomalyError).
BUDGET_PREFIX = "splat_project: binning budget exceeded: "


def _tiles(width: int, height: int) -> int:
    return -(-width // TILE_SIZE) * -(-height // TILE_SIZE)


def _overlaps() -> Any:
    """The data-dependent length of ``ids`` (an unbacked size under FakeTensor)."""
    return torch.library.get_ctx().new_dynamic_size()


def _fake_project(
    means: torch.Tensor,
    scales: torch.Tensor,
    rotations: torch.Tensor,
    opacities: torch.Tensor,
    colors: torch.Tensor,
    viewmat: torch.Tensor,
    K: torch.Tensor,
    background: torch.Tensor,
    width: int,
    height: int,
    sh_degree: int,
    max_bytes: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """Shape-only implementation of ``splat_project`` for torch.compile / FakeTensor."""
    torch._check(
        means.dim() == 2 and means.shape[1] == 3,
        lambda: f"splat_project: means must be [N, 3], got {list(means.shape)}",
    )
    torch._check(
        width >= 1 and height >= 1,
        lambda: f"splat_project: width and height must be >= 1, got {width}x{height}",
    )
    n = means.shape[0]
    i32, f32 = torch.int32, torch.float32
    half = means.dtype != f32  # float32 copies of opacities and background for render
    return (
        means.new_empty((n, 2), dtype=f32),
        means.new_empty((n, 3), dtype=f32),
        means.new_empty((n, 3), dtype=f32),
        means.new_empty((n,), dtype=f32),
        means.new_empty((n,), dtype=i32),
        means.new_empty((n, 4), dtype=i32),
        means.new_empty((_tiles(width, height), 2), dtype=i32),
        means.new_empty((_overlaps(),), dtype=i32),
        means.new_empty((n if half else 0,), dtype=f32),
        means.new_empty((3 if half else 0,), dtype=f32),
    )


def _fake_render(
    means2d: torch.Tensor,
    conics: torch.Tensor,
    opacities: torch.Tensor,
    rgb: torch.Tensor,
    depths: torch.Tensor,
    background: torch.Tensor,
    tile_ranges: torch.Tensor,
    ids: torch.Tensor,
    width: int,
    height: int,
) -> tuple[torch.Tensor, ...]:
    """Shape-only implementation of ``splat_render``."""
    torch._check(
        width >= 1 and height >= 1,
        lambda: f"splat_render: width and height must be >= 1, got {width}x{height}",
    )
    e = means2d.new_empty
    return (
        e((3, height, width)),
        e((height, width)),
        e((height, width)),
        e((height, width)),
        e((height, width), dtype=torch.int32),
    )


def _fake_render_backward(
    means2d: torch.Tensor,
    conics: torch.Tensor,
    opacities: torch.Tensor,
    rgb: torch.Tensor,
    depths: torch.Tensor,
    *rest: Any,
) -> tuple[torch.Tensor, ...]:
    """Shape-only implementation of ``splat_render_backward``: one gradient per input."""
    return (
        torch.empty_like(means2d),
        torch.empty_like(conics),
        torch.empty_like(opacities),
        torch.empty_like(rgb),
        torch.empty_like(depths),
    )


def _fake_project_backward(
    means: torch.Tensor,
    scales: torch.Tensor,
    rotations: torch.Tensor,
    colors: torch.Tensor,
    *rest: Any,
) -> tuple[torch.Tensor, ...]:
    """Shape-only implementation of ``splat_project_backward``: one gradient per parameter,
    in the parameters' dtype (the opacities' and background's [0] for float32 ones)."""
    half = means.dtype != torch.float32
    return (
        torch.empty_like(means),
        torch.empty_like(scales),
        torch.empty_like(rotations),
        torch.empty_like(colors),
        means.new_empty((means.shape[0] if half else 0,)),
        means.new_empty((3 if half else 0,)),
    )


def _zeros_if_none(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if grad is None else grad.contiguous()


def _project_setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    means, scales, rotations, _, colors, viewmat, K, _, width, height, sh_degree, _ = inputs
    ctx.save_for_backward(means, scales, rotations, colors, viewmat, K, output[4])
    ctx.dims = (width, height, sh_degree)
    # Gradients the loss does not reach come as None, not as zeros autograd would otherwise
    # allocate for every output: here radii, rects, ranges and ids (integers, 4 B per
    # Gaussian-tile overlap + 20 B per Gaussian: 54 MiB at 1M midtrain, at the step's peak).
    ctx.set_materialize_grads(False)


def _project_backward(
    ctx: Any,
    g_means2d: torch.Tensor | None,
    g_conics: torch.Tensor | None,
    g_rgb: torch.Tensor | None,
    g_depths: torch.Tensor | None,
    _g_radii: Any,
    _g_tiles: Any,
    _g_ranges: Any,
    _g_ids: Any,
    g_opacities: torch.Tensor | None,
    g_background: torch.Tensor | None,
) -> tuple[torch.Tensor | None, ...]:
    means, scales, rotations, colors, viewmat, K, radii = ctx.saved_tensors
    n = means.shape[0]
    f32 = means.new_empty((0,), dtype=torch.float32)
    # 16-bit parameters: render took the projection's float32 copies of the opacities and the
    # background ([N], [3]; [0] for float32 ones), whose gradients come back through here
    half = means.dtype != torch.float32
    grads = ops().project_backward(
        means,
        scales,
        rotations,
        colors,
        viewmat,
        K,
        radii,
        _zeros_if_none(g_means2d, f32.new_empty((n, 2))),
        _zeros_if_none(g_conics, f32.new_empty((n, 3))),
        _zeros_if_none(g_rgb, f32.new_empty((n, 3))),
        _zeros_if_none(g_depths, f32.new_empty((n,))),
        _zeros_if_none(g_opacities, f32.new_empty((n if half else 0,))),
        _zeros_if_none(g_background, f32.new_empty((3 if half else 0,))),
        *ctx.dims,
    )
    g_means, g_scales, g_rotations, g_colors, g_opac, g_bg = grads
    return (
        g_means,
        g_scales,
        g_rotations,
        g_opac if half else None,
        g_colors,
        None,
        None,
        g_bg if half else None,
    ) + (None,) * 4


def _render_setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    *tensors, width, height = inputs
    _, alpha, depth, final_T, n_contrib = output
    ctx.save_for_backward(*tensors, alpha, depth, final_T, n_contrib)
    ctx.dims = (width, height)
    # An unused alpha or depth gives None (no zero plane, and no work for it in the kernel).
    ctx.set_materialize_grads(False)


def _render_backward(
    ctx: Any,
    g_image: torch.Tensor | None,
    g_alpha: torch.Tensor | None,
    g_depth: torch.Tensor | None,
    *_: Any,
) -> tuple[torch.Tensor | None, ...]:
    saved = ctx.saved_tensors
    final_T = saved[10]
    g_image = _zeros_if_none(g_image, final_T.new_empty((3, *final_T.shape)))
    none = final_T.new_empty((0,))  # an output the loss does not use: no zero plane
    grads = ops().render_backward(
        *saved,
        g_image,
        none if g_alpha is None else g_alpha.contiguous(),
        none if g_depth is None else g_depth.contiguous(),
        *ctx.dims,
    )
    g_background = (g_image * final_T).sum((1, 2))  # image = ... + T_final * background
    return (*grads, g_background, None, None, None, None)


class _Ops(NamedTuple):
    project: Any
    render: Any
    render_backward: Any
    project_backward: Any


@functools.cache
def ops() -> _Ops:
    """The registered ops (loads the extension, registers fake implementations and autograd
    once).

    Raises:
        gpucheck.errors.ExtensionNotBuilt: the compiled extension is not installed.
    """
    found = _Ops(
        project=registered_op("gpucheck::splat_project", _fake_project),
        render=registered_op("gpucheck::splat_render", _fake_render),
        render_backward=registered_op("gpucheck::splat_render_backward", _fake_render_backward),
        project_backward=registered_op("gpucheck::splat_project_backward", _fake_project_backward),
    )
    torch.library.register_autograd(
        "gpucheck::splat_project", _project_backward, setup_context=_project_setup_context
    )
    torch.library.register_autograd(
        "gpucheck::splat_render", _render_backward, setup_context=_render_setup_context
    )
    return found


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
    """Render Gaussians into one image on their CUDA device (differentiable).

    Same arguments and conventions as :func:`gpucheck.reference.rasterize`. Inputs are
    *activated* values (positive scales, opacities in ``[0, 1]``), contiguous, on one CUDA
    device; the Gaussian parameters all float32, all bfloat16 or all float16, ``viewmat`` and
    ``K`` float32 (see "Half precision" in the module docstring: the outputs are float32
    whatever the parameters' dtype, gradients come in each parameter's own dtype). Runs on
    ``means.device`` whatever device is current, on the current stream, and synchronises that
    stream once (to read the number of tile overlaps before the binning buffers are
    allocated). The forward is deterministic (the same inputs give the same bits on every
    run); gradients agree to rounding (float atomics).

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
        max_bytes: if given, raise :class:`gpucheck.MemoryAnomalyError` when the binning
            buffers (``BYTES_PER_INTERSECTION`` per Gaussian-tile overlap) would exceed it.

    Returns:
        :class:`RasterizeResult` on ``means.device``; ``means2d`` retains its gradient when it
        requires one (the screen-space gradient of densification, see the module docstring).

    Raises:
        TypeError: an input is not a tensor, a parameter's dtype is not one of
            :data:`PARAMETER_DTYPES` or not that of ``means``, ``viewmat`` or ``K`` is not
            float32, or an int argument is not an int.
        ValueError: wrong shapes or devices, NaN/inf, non-activated values, a bad camera.
        gpucheck.MemoryAnomalyError: (a BudgetExceeded) the binning buffers exceed
            ``max_bytes`` or the free device memory; its attributes (and message) hold N, the
            visible count, the overlaps, the bytes needed and free, the radius percentiles,
            the share of Gaussians covering > 25 % of the image and a hint.
        gpucheck.errors.ExtensionNotBuilt: the compiled extension is not installed.
    """
    degree = _check_python_side(
        means,
        scales,
        rotations,
        opacities,
        colors,
        sh,
        sh_degree,
        viewmat,
        K,
        width,
        height,
        background,
        max_bytes,
    )
    if background is None:
        background = torch.zeros(3, dtype=means.dtype, device=means.device)
    values = colors if degree < 0 else sh
    found = ops()
    with _preflight_as_memory_anomaly():
        means2d, conics, rgb, depths, radii, tiles, ranges, ids, opac32, bg32 = found.project(
            means,
            scales,
            rotations,
            opacities,
            values,
            viewmat,
            K,
            background,
            width,
            height,
            degree,
            max_bytes,
        )
    if means2d.requires_grad:
        means2d.retain_grad()
    if means.dtype != torch.float32:  # render (float32) takes the projection's copies
        opacities, background = opac32, bg32
    image, alpha, depth, _, _ = found.render(
        means2d, conics, opacities, rgb, depths, background, ranges, ids, width, height
    )
    return RasterizeResult(
        image=image,
        alpha=alpha,
        depth=depth,
        radii=radii,
        means2d=means2d,
        depths=depths,
        conics=conics,
        colors=rgb,
        tiles=tiles,
        n_intersections=int(ids.shape[0]),
    )


@contextlib.contextmanager
def _preflight_as_memory_anomaly() -> Iterator[None]:
    """The projection's failed memory preflight (a torch.OutOfMemoryError whose message holds
    :data:`BUDGET_PREFIX`) raised as what it means: :class:`gpucheck.MemoryAnomalyError`."""
    try:
        yield
    except torch.OutOfMemoryError as err:
        msg = str(err).split("\nException raised from")[0]
        if BUDGET_PREFIX in msg:
            raise MemoryAnomalyError(msg[msg.index(BUDGET_PREFIX) :]) from None
        raise


def _check_python_side(
    means: Any,
    scales: Any,
    rotations: Any,
    opacities: Any,
    colors: Any,
    sh: Any,
    sh_degree: Any,
    viewmat: Any,
    K: Any,
    width: Any,
    height: Any,
    background: Any,
    max_bytes: Any,
) -> int:
    """What the C++ entry point cannot say as well (types, CPU tensors, colours vs SH);
    returns the SH degree to pass (-1 for RGB colours). Shapes, dtypes, contiguity and values
    are checked by the entry point, so that torch.ops callers get the same errors."""
    named = {
        "means": means,
        "scales": scales,
        "rotations": rotations,
        "opacities": opacities,
        "viewmat": viewmat,
        "K": K,
        "colors": colors,
        "sh": sh,
        "background": background,
    }
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
    _check_dtypes(named)
    for name, t in named.items():
        if t is not None and t.device.type != "cuda":
            raise ValueError(
                f"rasterize: {name} must be a CUDA tensor, got one on {t.device} "
                "(gpucheck.reference.rasterize is the CPU implementation)"
            )
    return degree


def _check_dtypes(named: dict[str, Any]) -> None:
    """The Gaussian parameters share one dtype of PARAMETER_DTYPES; the camera is float32."""
    dtype = named["means"].dtype
    if dtype not in PARAMETER_DTYPES:
        raise TypeError(
            f"rasterize: means must be float32, bfloat16 or float16 (the Gaussian "
            f"parameters' dtype), got {dtype}"
        )
    others = [
        f"{name} is {named[name].dtype}"
        for name in _PARAMETERS
        if named[name] is not None and named[name].dtype != dtype
    ]
    if others:
        raise TypeError(
            f"rasterize: the Gaussian parameters (means, scales, rotations, opacities, colors "
            f"or sh, background) must share one dtype (float32, bfloat16 or float16): means is "
            f"{dtype} but {', '.join(others)}"
        )
    for name in ("viewmat", "K"):
        if named[name].dtype != torch.float32:
            raise TypeError(
                f"rasterize: {name} must be float32 (the camera stays float32 "
                f"whatever the Gaussian parameters' dtype), got "
                f"{named[name].dtype}"
            )
