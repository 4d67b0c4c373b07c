"""Pure-PyTorch 3D Gaussian splatting rasterizer: the oracle for gpucheck's splat kernel.

Dense per pixel (every pixel looks at every Gaussian whose tile rectangle covers it), float64,
differentiable by autograd, so ``torch.autograd.grad`` gives the gradient of any loss with
respect to means, scales, rotations, opacities, colours / SH and the background, and
``result.means2d.grad`` the screen-space mean gradient that densification uses. Meant for
scenes up to ~2,000 Gaussians at up to 64×64 on CPU.

Conventions (the CUDA kernel must follow them):

* Camera: ``viewmat`` is world → camera, column-vector form (``p_cam = viewmat @ [p, 1]``,
  bottom row ``0 0 0 1``), OpenCV axes (x right, y down, z forward). Note that 3DGS stores
  ``world_view_transform`` *transposed*; pass ``world_view_transform.T``.
* Pixels: ``means2d = (fx * x / z + cx, fy * y / z + cy)`` in pixel units; pixel (row ``i``,
  column ``j``) covers ``[j, j + 1) × [i, i + 1)`` and is evaluated at its centre
  ``(j + 0.5, i + 0.5)``.
* Culling: a Gaussian with camera depth ``z <= 0.2`` (the near plane), or whose 3-sigma
  square (see Radius) misses the image's tiles, gets radius 0 and contributes nothing.
* Projection: 3D covariance ``R S S^T R^T`` from the scales and the normalized wxyz quaternion;
  2D covariance ``J W Σ W^T J^T + 0.3 I`` (EWA with the usual low-pass), ``J`` the Jacobian of
  the pinhole projection at the camera-space mean, whose ``x / z`` and ``y / z`` are first
  clamped to 1.3× the half field of view (measured from the principal point), as 3DGS and
  gsplat do so that Gaussians far outside the view do not blow up.
* Radius: ``ceil(3 * sqrt(lambda_max))`` with ``lambda_max = mid + sqrt(max(0.1, mid² - det))``
  (``radii``; 0 only for the culled Gaussians above).
* Tiles are 16×16. A Gaussian's tile rectangle is the tiles its radius's square spans,
  ``floor((m - r) / 16) .. ceil((m + r) / 16) - 1`` per axis (clamped to the image),
  intersected with the tiles its opacity-aware box spans (the same formula with the box's
  half extent per axis for ``r``). The box bounds the region where the Gaussian can still
  reach ``alpha >= 1/255``, ``d^T Σ2D^-1 d <= t = 2 ln(255 opacity)``: half extents
  ``sqrt(t Σxx)`` and ``sqrt(t Σyy)`` (no box when ``opacity < 1/255``), widened by tiny
  margins so that the float32 kernel cannot reach 1/255 outside it either (``_tile_box``).
  A Gaussian is evaluated only at pixels of its tiles. The tiles the box drops
  hold no pixel with ``alpha >= 1/255``, so they change no output, only the work and the
  binning memory (``n_intersections``). A visible Gaussian (radius > 0) may touch no tile at
  all (rectangle ``[0, 0, 0, 0]``): radii keep the 3DGS meaning, ``radii > 0`` = in the view,
  which densification's visibility filter reads, whatever the opacity.
* Compositing, per pixel, front to back by camera depth rounded to float32, ties in index
  order (``compositing_order``: the CUDA kernel's stable sort on float32 depths, the key
  3DGS and gsplat sort on too; Gaussians closer in depth than that resolution composite in
  index order):
  ``alpha = min(0.99, opacity * exp(-0.5 d^T Σ2D^-1 d))``; Gaussians with ``alpha < 1/255``
  are skipped; if compositing a Gaussian would make the transmittance drop below ``1e-4`` it
  is *not* composited and the pixel stops there (3DGS semantics: ``test_T < 0.0001 → done``).
  Final colour ``sum_i c_i alpha_i T_i + T_final * background``.
* Outputs ``alpha = 1 - T_final`` and the expected depth ``sum_i z_i alpha_i T_i / alpha``
  (0 where ``alpha`` is 0).
"""

from __future__ import annotations

import math
from typing import NamedTuple, NoReturn

import torch

from gpucheck.errors import BudgetExceeded
from gpucheck.kernels.splat.reference_sh import MAX_SH_DEGREE, sh_to_color

#: the names gpucheck.reference exports of this kernel (gpucheck/kernels/__init__.py)
__all__ = ["RasterizeResult", "rasterize"]

NEAR_PLANE = 0.2
TILE_SIZE = 16
LOW_PASS = 0.3
ALPHA_MIN = 1.0 / 255.0
ALPHA_MAX = 0.99
T_MIN = 1e-4
#: Margins of the opacity-aware tile box (see ``_tile_box``; csrc/splat/splat_cuda.cu's
#: ``tile_box`` derives them): on ``t = 2 ln(255 opacity)``, on the skew ``Sxx Syy / det``,
#: times ``|screen mean|`` on the extents, and the skew above which only the square is used.
TILE_BOX_SLACK_T = 2.0**-17
TILE_BOX_SLACK_QUAD = 2.0**-18
TILE_BOX_SLACK_MEAN = 2.0**-22
TILE_BOX_MAX_SKEW = 2.0**17
#: Bytes per (Gaussian, tile) pair of a tiled kernel's binning buffers: a 64-bit key and a
#: 32-bit value, each double-buffered for the radix sort.
BYTES_PER_INTERSECTION = 24
#: Bound on the elements of one [pixels, Gaussians] matrix of the dense compositing.
_CHUNK_ELEMENTS = 1 << 21


class RasterizeResult(NamedTuple):
    """What :func:`rasterize` returns, and the kernel's ``gpucheck.ops.rasterize`` too (one
    result type: float64 from this oracle, float32 from the kernel, unless stated)."""

    image: torch.Tensor  #: [3, H, W] composited colour, background included
    alpha: torch.Tensor  #: [H, W] 1 - final transmittance
    depth: torch.Tensor  #: [H, W] expected camera depth (0 where alpha is 0)
    radii: torch.Tensor  #: [N] int32 pixel radius, 0 for culled Gaussians
    means2d: torch.Tensor  #: [N, 2] pixel coordinates; .grad after backward if tracked
    depths: torch.Tensor  #: [N] camera-space z
    #: [N, 3] inverse 2D covariance (a, b, c) of [[a, b], [b, c]]; 0 where the radius is 0
    conics: torch.Tensor
    colors: torch.Tensor  #: [N, 3] per-Gaussian colour (evaluated SH or as given)
    tiles: torch.Tensor  #: [N, 4] int32 tile rectangle x_min, y_min, x_max, y_max (excl.)
    n_intersections: int  #: sum over Gaussians of the tiles they touch (overlaps)


def _fail(msg: str) -> NoReturn:
    raise ValueError(f"rasterize: {msg}")


def _check_tensor(name: str, t: object, shape: tuple[int | None, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"rasterize: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"rasterize: {name} must be floating point, got {t.dtype}")
    want = "[" + ", ".join("N" if s is None else str(s) for s in shape) + "]"
    if t.dim() != len(shape) or any(
        s is not None and s != g for s, g in zip(shape, t.shape, strict=True)
    ):
        _fail(f"{name} must be {want}, got {list(t.shape)}")
    bad = ~torch.isfinite(t.detach())
    if bool(bad.any()):
        _fail(f"{name} holds {int(bad.sum())} NaN/inf value(s)")
    return t


def _check_inputs(
    means: torch.Tensor,
    scales: torch.Tensor,
    rotations: torch.Tensor,
    opacities: torch.Tensor,
    colors: torch.Tensor | None,
    sh: torch.Tensor | None,
    sh_degree: int | None,
    viewmat: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
    background: torch.Tensor | None,
    max_bytes: int | None,
) -> int:
    """Validate every input; return the SH degree to use (-1 for precomputed colours)."""
    _check_tensor("means", means, (None, 3))
    n = means.shape[0]
    _check_tensor("scales", scales, (n, 3))
    _check_tensor("rotations", rotations, (n, 4))
    _check_tensor("opacities", opacities, (n,))
    _check_tensor("viewmat", viewmat, (4, 4))
    _check_tensor("K", K, (3, 3))
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            _fail(f"{name} must be a positive int, got {v!r}")
    if max_bytes is not None and (
        isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0
    ):
        _fail(f"max_bytes must be None or an int >= 0, got {max_bytes!r}")
    if background is not None:
        _check_tensor("background", background, (3,))
    tensors = [means, scales, rotations, opacities, viewmat, K, colors, sh, background]
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        _fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if n and bool((scales <= 0).any()):
        _fail(
            f"scales must be positive (activated, exp of the log-scales), got min "
            f"{float(scales.min()):.4g}: raw log-scales from a checkpoint need exp first"
        )
    if n and bool(((opacities < 0) | (opacities > 1)).any()):
        _fail(
            f"opacities must be in [0, 1] (activated, sigmoid of the logits), got range "
            f"[{float(opacities.min()):.4g}, {float(opacities.max()):.4g}]"
        )
    if n and bool((rotations.detach().norm(dim=1) == 0).any()):
        _fail("rotations hold an all-zero quaternion (cannot be normalized)")
    bottom = viewmat.detach().new_tensor([0.0, 0.0, 0.0, 1.0])
    if not torch.equal(viewmat.detach()[3], bottom):
        _fail(
            f"viewmat must be world-to-camera with bottom row [0, 0, 0, 1], got bottom row "
            f"{viewmat[3].tolist()} (3DGS's world_view_transform is stored transposed)"
        )
    k = K.detach()
    if not (
        k[0, 0] > 0
        and k[1, 1] > 0
        and k[0, 1] == 0
        and k[1, 0] == 0
        and torch.equal(k[2], k.new_tensor([0.0, 0.0, 1.0]))
    ):
        _fail(f"K must be [[fx, 0, cx], [0, fy, cy], [0, 0, 1]] with fx, fy > 0, got {k.tolist()}")
    if colors is not None and sh is None:
        _check_tensor("colors", colors, (n, 3))
    if sh is not None and colors is None:
        _check_tensor("sh", sh, (n, None, 3))
    return sh_degree_of(colors, sh, sh_degree)


def sh_degree_of(
    colors: torch.Tensor | None, sh: torch.Tensor | None, sh_degree: int | None
) -> int:
    """The colour rule shared by the reference and the CUDA op: exactly one of ``colors``
    ([N, 3]) and ``sh`` ([N, K, 3]); returns -1 for RGB colours, else the SH degree to
    evaluate (given, or derived from K), checked against what ``sh`` holds."""
    if (colors is None) == (sh is None):
        _fail("give exactly one of colors ([N, 3]) and sh ([N, K, 3])")
    if colors is not None:
        if sh_degree is not None:
            _fail("sh_degree only applies with sh, not with colors")
        return -1
    assert sh is not None
    if sh.dim() != 3:
        _fail(f"sh must be [N, K, 3], got {list(sh.shape)}")
    coeffs = sh.shape[1]
    if sh_degree is None:
        sh_degree = math.isqrt(coeffs) - 1
        if (sh_degree + 1) ** 2 != coeffs or sh_degree > MAX_SH_DEGREE:
            _fail(
                f"sh must hold (d + 1)^2 coefficients per channel for a degree d in "
                f"0..{MAX_SH_DEGREE}, got sh of shape {list(sh.shape)}"
            )
    if (
        isinstance(sh_degree, bool)
        or not isinstance(sh_degree, int)
        or not (0 <= sh_degree <= MAX_SH_DEGREE)
    ):
        _fail(f"sh_degree must be an int in 0..{MAX_SH_DEGREE}, got {sh_degree!r}")
    if coeffs < (sh_degree + 1) ** 2:
        _fail(
            f"sh_degree {sh_degree} needs {(sh_degree + 1) ** 2} coefficients per channel, "
            f"got sh of shape {list(sh.shape)}"
        )
    return sh_degree


def quat_to_rotmat(quats: torch.Tensor) -> torch.Tensor:
    """Rotation matrices of (unnormalized) wxyz quaternions: ``[N, 4] -> [N, 3, 3]``."""
    w, x, y, z = torch.nn.functional.normalize(quats, dim=-1).unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z),
        2 * (x * y - w * z),
        2 * (x * z + w * y),
        2 * (x * y + w * z),
        1 - 2 * (x * x + z * z),
        2 * (y * z - w * x),
        2 * (x * z - w * y),
        2 * (y * z + w * x),
        1 - 2 * (x * x + y * y),
    ]
    return torch.stack(rows, dim=-1).reshape(-1, 3, 3)


def covariance_3d(scales: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """World-space covariance ``R diag(s)^2 R^T``: ``[N, 3], [N, 4] -> [N, 3, 3]``."""
    m = quat_to_rotmat(rotations) * scales.unsqueeze(-2)  # R @ diag(s)
    return m @ m.transpose(-1, -2)


class Projection(NamedTuple):
    """Per-Gaussian preprocessing results of :func:`project`."""

    means2d: torch.Tensor  # [N, 2]
    depths: torch.Tensor  # [N]
    cov2d: torch.Tensor  # [N, 2, 2] low-pass included
    conics: torch.Tensor  # [N, 3]
    radii: torch.Tensor  # [N] int32
    tiles: torch.Tensor  # [N, 4] int32


def _tile_box(
    sxx: torch.Tensor,
    syy: torch.Tensor,
    det: torch.Tensor,
    means2d: torch.Tensor,
    opacities: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Half extents ``[N, 2]`` (pixels, about ``means2d``) of the box outside which a Gaussian
    never reaches ``alpha >= 1/255``, and ``[N]`` whether it reaches it anywhere; ``sxx``,
    ``syy``, ``det``: its 2D covariance's diagonal (low-pass included) and determinant.

    ``opacity * exp(-q / 2) >= 1/255`` needs ``q = d^T cov2d^-1 d <= t = 2 ln(255 opacity)``:
    nowhere when ``opacity < 1/255``, else inside the ellipse's bounding box ``sqrt(t Sxx)``,
    ``sqrt(t Syy)``. The ``TILE_BOX_*`` margins widen it so that the float32 kernel's alpha
    (screen mean and conic rounded to float32, the exponent with fmas, ``ex2`` for ``exp``)
    cannot reach 1/255 outside it either (csrc/splat/splat_cuda.cu, ``tile_box``, has the
    derivation); ellipses too thin and tilted for that bound (skew ``Sxx Syy / det`` above
    ``TILE_BOX_MAX_SKEW``) get an infinite box, i.e. the square alone.
    """
    reaches = opacities >= ALPHA_MIN
    skew = sxx * syy / torch.where(det > 0, det, torch.ones_like(det))
    bounded = (det > 0) & (skew <= TILE_BOX_MAX_SKEW)
    t = 2.0 * torch.log(torch.where(reaches, 255.0 * opacities, torch.ones_like(opacities)))
    s = (t + TILE_BOX_SLACK_T) / (1.0 - TILE_BOX_SLACK_QUAD * torch.where(bounded, skew, 0.0))
    ext = (
        torch.sqrt(s[:, None] * torch.stack([sxx, syy], dim=1))
        + TILE_BOX_SLACK_MEAN * means2d.abs()
    )
    return torch.where(bounded[:, None], ext, math.inf), reaches


def project(
    means: torch.Tensor,
    scales: torch.Tensor,
    rotations: torch.Tensor,
    viewmat: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
    opacities: torch.Tensor,
) -> Projection:
    """Per-Gaussian preprocessing (float64 inputs): screen mean, depth, 2D covariance, radius,
    tile rectangle (``opacities`` [N] set its opacity-aware box).

    Culled Gaussians get radius 0 and an empty tile rectangle; their other outputs are finite
    but meaningless. A visible Gaussian (radius > 0) may still touch no tile (rectangle
    ``[0, 0, 0, 0]``): when it reaches ``alpha >= 1/255`` nowhere in the image.
    """
    rot, trans = viewmat[:3, :3], viewmat[:3, 3]
    p = means @ rot.T + trans  # [N, 3]
    z = p[:, 2]
    in_front = z > NEAR_PLANE
    zs = torch.where(in_front, z, torch.ones_like(z))  # keeps culled rows finite (and grads)
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    u, v = p[:, 0] / zs, p[:, 1] / zs
    means2d = torch.stack([fx * u + cx, fy * v + cy], dim=-1)

    margin_x, margin_y = 0.3 * 0.5 * width / fx, 0.3 * 0.5 * height / fy
    uc = torch.minimum(torch.maximum(u, -cx / fx - margin_x), (width - cx) / fx + margin_x)
    vc = torch.minimum(torch.maximum(v, -cy / fy - margin_y), (height - cy) / fy + margin_y)
    zero = torch.zeros_like(zs)
    jac = torch.stack([fx / zs, zero, -fx * uc / zs, zero, fy / zs, -fy * vc / zs], dim=-1).reshape(
        -1, 2, 3
    )
    t = jac @ rot  # J W
    cov2d = t @ covariance_3d(scales, rotations) @ t.transpose(-1, -2)
    cov2d = cov2d + LOW_PASS * torch.eye(2, dtype=cov2d.dtype, device=cov2d.device)
    a, b, c = cov2d[:, 0, 0], cov2d[:, 0, 1], cov2d[:, 1, 1]
    det = a * c - b * b
    ok = in_front & (det > 0)
    det_s = torch.where(ok, det, torch.ones_like(det))
    conics = torch.stack([c / det_s, -b / det_s, a / det_s], dim=-1)

    with torch.no_grad():
        mid = 0.5 * (a + c)
        lam = mid + torch.sqrt(torch.clamp_min(mid * mid - det, 0.1))
        radius = torch.ceil(3.0 * torch.sqrt(lam.clamp_min(0.0)))
        radius = torch.where(ok, radius, torch.zeros_like(radius))
        m = means2d.detach()
        grid = torch.tensor(
            [math.ceil(width / TILE_SIZE), math.ceil(height / TILE_SIZE)],
            dtype=m.dtype,
            device=m.device,
        )
        lo = torch.minimum(torch.floor((m - radius[:, None]) / TILE_SIZE).clamp_min(0), grid)
        hi = torch.minimum(torch.ceil((m + radius[:, None]) / TILE_SIZE).clamp_min(0), grid)
        ok = ok & ((hi - lo).prod(dim=1) > 0) & (radius > 0)
        radii = torch.where(ok, radius, torch.zeros_like(radius)).to(torch.int32)
        # the tile rectangle: the square's tiles that the opacity-aware box touches
        ext, reaches = _tile_box(
            a.detach(), c.detach(), det.detach(), m, opacities.detach().to(m.dtype)
        )
        lo = torch.maximum(lo, torch.minimum(torch.floor((m - ext) / TILE_SIZE).clamp_min(0), grid))
        hi = torch.minimum(hi, torch.minimum(torch.ceil((m + ext) / TILE_SIZE).clamp_min(0), grid))
        touches = ok & reaches & ((hi - lo).clamp_min(0).prod(dim=1) > 0)
        tiles = torch.where(touches[:, None], torch.cat([lo, hi], dim=1), 0.0).to(torch.int32)
    return Projection(means2d, z, cov2d, conics, radii, tiles)


def compositing_order(depths: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """The Gaussians ``visible`` ([V] ascending indices) front to back: by camera depth
    (``depths`` [N]) rounded to float32, ties in index order.

    The CUDA kernel sorts on its float32 depths (rounded from the same float64 depth as
    here), stably, so ties keep index order. Ordering by the float64 depths instead would
    composite two Gaussians less than one float32 ulp (<= 1.2e-7 relative) apart in the
    opposite order wherever index and depth disagree: the pixel's colour moves by
    ``a_1 a_2 T (c_1 - c_2)`` and, where the pair meets the 1e-4 stop, the stop drops the
    other one (``test_gradients_at_depth_tie`` in suites/splat). Either order is as right;
    this one the kernel can follow exactly.
    """
    key = depths.detach()[visible].to(torch.float32)
    return visible[torch.argsort(key, stable=True)]


def estimate_binning_bytes(n_intersections: int) -> int:
    """Bytes a tiled kernel needs to bin ``n_intersections`` (Gaussian, tile) pairs."""
    return n_intersections * BYTES_PER_INTERSECTION


def _composite_rows(
    rows: range,
    width: int,
    means2d: torch.Tensor,
    conics: torch.Tensor,
    opacities: torch.Tensor,
    colors: torch.Tensor,
    depths: torch.Tensor,
    tiles: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Composite pixel rows ``rows`` over Gaussians given front to back.

    Returns ``[P, 3]`` colour, ``[P]`` final transmittance, ``[P]`` accumulated depth for the
    ``P = len(rows) * width`` pixels in row-major order.
    """
    dev, dt = means2d.device, means2d.dtype
    iy, ix = torch.meshgrid(
        torch.arange(rows.start, rows.stop, device=dev),
        torch.arange(width, device=dev),
        indexing="ij",
    )
    iy, ix = iy.reshape(-1, 1), ix.reshape(-1, 1)  # [P, 1]
    dx = means2d[:, 0] - (ix.to(dt) + 0.5)  # [P, G]
    dy = means2d[:, 1] - (iy.to(dt) + 0.5)
    power = -0.5 * (conics[:, 0] * dx * dx + conics[:, 2] * dy * dy) - conics[:, 1] * dx * dy
    tx, ty = ix // TILE_SIZE, iy // TILE_SIZE
    covers = (tx >= tiles[:, 0]) & (ty >= tiles[:, 1]) & (tx < tiles[:, 2]) & (ty < tiles[:, 3])
    alpha = torch.clamp_max(opacities * torch.exp(power), ALPHA_MAX)
    with torch.no_grad():
        keep = covers & (power <= 0) & (alpha >= ALPHA_MIN)
        t_after = torch.cumprod(1 - torch.where(keep, alpha, 0.0), dim=1)
        keep &= t_after >= T_MIN  # T only falls, so this also drops all after the stop
    alpha = torch.where(keep, alpha, torch.zeros_like(alpha))
    trans = torch.cumprod(1 - alpha, dim=1)  # T after each
    t_before = torch.cat([torch.ones_like(trans[:, :1]), trans[:, :-1]], dim=1)
    weights = alpha * t_before
    t_final = trans[:, -1] if trans.shape[1] else trans.new_ones(trans.shape[0])
    return weights @ colors, t_final, weights @ depths


def _within_budget(proj: Projection, max_bytes: int | None) -> int:
    """The (Gaussian, tile) pairs of ``proj``; raises BudgetExceeded where binning them would
    take more than ``max_bytes``."""
    touched = (proj.tiles[:, 2] - proj.tiles[:, 0]) * (proj.tiles[:, 3] - proj.tiles[:, 1])
    n_intersections = int(touched.sum())
    if max_bytes is not None and estimate_binning_bytes(n_intersections) > max_bytes:
        raise BudgetExceeded(
            f"rasterize: {proj.radii.shape[0]} Gaussians touch {n_intersections} tiles in "
            f"total, binning needs {estimate_binning_bytes(n_intersections)} bytes > max_bytes "
            f"{max_bytes}; largest radius {int(proj.radii.max())} px (are the scales "
            f"activated twice?)"
        )
    return n_intersections


def _colors(
    colors: torch.Tensor | None,
    sh: torch.Tensor | None,
    degree: int,
    means: torch.Tensor,
    viewmat: torch.Tensor,
) -> torch.Tensor:
    """``[N, 3]`` float64 colour per Gaussian: ``colors`` as given (``degree`` -1), else ``sh``
    evaluated to ``degree`` in the direction from the camera centre to each mean (float64
    ``means`` and ``viewmat``)."""
    if degree < 0:
        assert colors is not None
        return colors.to(torch.float64)
    assert sh is not None
    campos = -viewmat[:3, :3].T @ viewmat[:3, 3]
    dirs = torch.nn.functional.normalize(means - campos, dim=-1)
    return sh_to_color(sh.to(torch.float64), dirs, degree)


def _composite(
    proj: Projection, opacities: torch.Tensor, rgb: torch.Tensor, width: int, height: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The image of the visible Gaussians of ``proj`` composited front to back: ``[H * W, 3]``
    colour (background not included), ``[H * W]`` final transmittance and accumulated depth,
    in row-major pixel order; one tile row at a time over the Gaussians that reach it, in
    chunks of at most ``_CHUNK_ELEMENTS`` pixel-Gaussian pairs."""
    visible = (proj.radii > 0).nonzero().squeeze(1)
    order = compositing_order(proj.depths, visible)
    image, trans, depth_acc = [], [], []
    for y0 in range(0, height, TILE_SIZE):
        band = range(y0, min(y0 + TILE_SIZE, height))
        ty = y0 // TILE_SIZE
        sel = order[(proj.tiles[order, 1] <= ty) & (proj.tiles[order, 3] > ty)]
        step = max(1, _CHUNK_ELEMENTS // max(1, sel.numel() * width))
        for r0 in range(band.start, band.stop, step):
            c, t, d = _composite_rows(
                range(r0, min(r0 + step, band.stop)),
                width,
                proj.means2d[sel],
                proj.conics[sel],
                opacities[sel],
                rgb[sel],
                proj.depths[sel],
                proj.tiles[sel],
            )
            image.append(c)
            trans.append(t)
            depth_acc.append(d)
    return torch.cat(image), torch.cat(trans), torch.cat(depth_acc)


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
    """Render Gaussians into one image (see the module docstring for every convention).

    Inputs are *activated* values, as 3DGS and gsplat pass them to their rasterizers; a
    checkpoint's raw parameters go through ``gpucheck.checkpoints.GaussianParams.activated``.
    Everything is computed in float64 on the inputs' device; gradients flow back to every
    floating-point input in its own dtype.

    Args:
        means: ``[N, 3]`` world-space centres.
        scales: ``[N, 3]`` standard deviations along the Gaussian's axes, ``> 0``.
        rotations: ``[N, 4]`` quaternions ``(w, x, y, z)``, any non-zero norm.
        opacities: ``[N]`` in ``[0, 1]``.
        colors: ``[N, 3]`` precomputed RGB; exclusive with ``sh``.
        sh: ``[N, K, 3]`` SH coefficients (``K = (d + 1)^2``, dc first); exclusive with
            ``colors``.
        sh_degree: degree to evaluate (0..3, at most what ``sh`` holds); default: all of ``sh``.
        viewmat: ``[4, 4]`` world-to-camera matrix (column-vector form, OpenCV axes).
        K: ``[3, 3]`` pinhole intrinsics ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``.
        width: image width in pixels.
        height: image height in pixels.
        background: ``[3]`` colour behind everything; default black.
        max_bytes: if given, raise :class:`gpucheck.errors.BudgetExceeded` when a tiled
            kernel's binning buffers (:func:`estimate_binning_bytes`) would exceed it, before
            any compositing: the symptom of Gaussians activated twice is that each one covers
            every tile.

    Returns:
        :class:`RasterizeResult`; ``means2d`` retains its gradient when it requires one.

    Raises:
        TypeError: an input is not a floating-point tensor.
        ValueError: wrong shapes, NaN/inf, non-activated values, a bad camera.
        BudgetExceeded: ``max_bytes`` is too small for this scene.
    """
    degree = _check_inputs(
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
    f64 = torch.float64
    means, scales, rotations = means.to(f64), scales.to(f64), rotations.to(f64)
    opacities, viewmat, K = opacities.to(f64), viewmat.to(f64), K.to(f64)
    proj = project(means, scales, rotations, viewmat, K, width, height, opacities)
    means2d = proj.means2d
    if means2d.requires_grad:
        means2d.retain_grad()
    n_intersections = _within_budget(proj, max_bytes)
    rgb = _colors(colors, sh, degree, means, viewmat)
    bg = (
        torch.zeros(3, dtype=f64, device=means.device) if background is None else background.to(f64)
    )
    color, t_final, acc_depth = _composite(proj, opacities, rgb, width, height)
    alpha = 1 - t_final
    img = color + t_final[:, None] * bg  # [H * W, 3]
    has = alpha > 0
    depth = torch.where(has, acc_depth / torch.where(has, alpha, torch.ones_like(alpha)), 0.0)
    return RasterizeResult(
        image=img.T.reshape(3, height, width),
        alpha=alpha.reshape(height, width),
        depth=depth.reshape(height, width),
        radii=proj.radii,
        means2d=means2d,
        depths=proj.depths,
        conics=proj.conics,
        colors=rgb,
        tiles=proj.tiles,
        n_intersections=n_intersections,
    )
