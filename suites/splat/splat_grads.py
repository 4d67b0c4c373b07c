"""Gradients of gpucheck.ops.rasterize and of the float64 reference for one random loss, and
their differences: shared by the gradient suite (test_splat_backward.py) and the benchmark."""

from __future__ import annotations

from typing import Any

import torch

from gpucheck.kernels.splat.reference import (
    ALPHA_MAX,
    ALPHA_MIN,
    T_MIN,
    TILE_SIZE,
    compositing_order,
    project,
)
from gpucheck.ops import rasterize
from gpucheck.reference import rasterize as reference

#: Inputs that take a gradient (those of them that a scene has).
LEAVES = ("means", "scales", "rotations", "opacities", "colors", "sh", "background")
#: Where ``errors`` counts a Gaussian as off: times max |reference gradient|.
ELEMENT_ATOL = 1e-3
#: The same for gradients stored in a 16-bit dtype: rounding one to bfloat16 alone moves it by
#: up to 2^-8 (3.9e-3) of its size, beyond ELEMENT_ATOL; float16's 2^-11 (4.9e-4) stays within
#: it. (Measured largest element error over the largest gradient, benchmarks/
#: splat_tolerances.py --dtype on an H200: bfloat16 3.9e-3, float16 4.8e-4.)
ELEMENT_ATOL_BY_DTYPE = {
    torch.float32: ELEMENT_ATOL,
    torch.float16: ELEMENT_ATOL,
    torch.bfloat16: 2.0**-7,
}
DEPTH_WEIGHT = 0.1
#: Relative windows around the compositing decisions within which the float32 kernel and the
#: float64 reference may decide differently (see ``decision_pixels``): opacity * G against
#: 1/255 and the 0.99 clamp, and the transmittance against the 1e-4 stop.
ALPHA_RTOL = 1e-4
T_RTOL = 1e-3
_CHUNK_ELEMENTS = 1 << 21


def _loss(
    res: Any, weights: dict[str, torch.Tensor], extra: bool, image_only: bool = False
) -> torch.Tensor:
    loss = (res.image * weights["image"]).sum()
    if image_only:  # alpha and depth get no gradient (the render backward's [0] planes)
        return loss
    loss = loss + (res.alpha * weights["alpha"]).sum()
    loss = loss + DEPTH_WEIGHT * (res.depth * weights["depth"]).sum()
    if extra:  # losses on the per-Gaussian outputs (exercise splat_project's backward alone)
        loss = (
            loss
            + (res.means2d * weights["means2d"]).sum()
            + (res.depths * weights["depths"]).sum()
            + (res.colors * weights["colors"]).sum()
        )
    return loss


def decision_pixels(args: dict[str, Any]) -> torch.Tensor:
    """[H, W] bool: the pixels at which float32 may take another compositing decision than
    float64: some Gaussian of the pixel's tile has ``opacity * G`` within a relative ALPHA_RTOL
    of 1/255 (composited or skipped) or of 0.99 (clamped, so no opacity / exponent gradient,
    or not), or the transmittance after a composited Gaussian lies within a relative T_RTOL of
    1e-4 (the pixel stops before it or after it). Evaluated in float64 like the reference.

    The kernel's alpha carries relative errors up to ~1e-5 (conic and screen mean rounded to
    float32, the exponent's rounding, ``ex2``) and its transmittance, a product over the list,
    up to ~1e-4 in opaque stacks. Where a decision falls within that, both sides are right and
    their gradients differ by that pixel's whole share (the gradient is discontinuous there:
    the float64 reference moves as much when its inputs move by float32 rounding).
    """
    d = {
        k: (v.detach().cpu().double() if isinstance(v, torch.Tensor) else v)
        for k, v in args.items()
    }
    h, w = args["height"], args["width"]
    proj = project(
        d["means"], d["scales"], d["rotations"], d["viewmat"], d["K"], w, h, d["opacities"]
    )
    out = torch.zeros(h * w, dtype=torch.bool)
    vis = compositing_order(proj.depths, (proj.radii > 0).nonzero().flatten())
    if vis.numel() == 0:
        return out.reshape(h, w)
    means2d, conics = proj.means2d[vis].detach(), proj.conics[vis].detach()
    opacities, tiles = d["opacities"][vis], proj.tiles[vis]
    rows = max(1, _CHUNK_ELEMENTS // (w * vis.numel()))
    for y0 in range(0, h, rows):
        iy, ix = torch.meshgrid(torch.arange(y0, min(h, y0 + rows)), torch.arange(w), indexing="ij")
        iy, ix = iy.reshape(-1, 1), ix.reshape(-1, 1)
        dx = means2d[:, 0] - (ix + 0.5)
        dy = means2d[:, 1] - (iy + 0.5)
        power = -0.5 * (conics[:, 0] * dx * dx + conics[:, 2] * dy * dy) - conics[:, 1] * dx * dy
        tx, ty = ix // TILE_SIZE, iy // TILE_SIZE
        covers = (
            (tx >= tiles[:, 0])
            & (ty >= tiles[:, 1])
            & (tx < tiles[:, 2])
            & (ty < tiles[:, 3])
            & (power <= 0)
        )
        raw = opacities * torch.exp(power)
        alpha = raw.clamp_max(ALPHA_MAX)
        keep = covers & (alpha >= ALPHA_MIN)
        t_after = torch.cumprod(1 - torch.where(keep, alpha, 0.0), dim=1)
        near = covers & (
            ((raw - ALPHA_MIN).abs() <= ALPHA_RTOL * ALPHA_MIN)
            | ((raw - ALPHA_MAX).abs() <= ALPHA_RTOL * ALPHA_MAX)
        )
        near |= keep & ((t_after - T_MIN).abs() <= T_RTOL * T_MIN)
        out[y0 * w : y0 * w + near.shape[0]] = near.any(1)
    return out.reshape(h, w)


def gradients(
    args: dict[str, Any],
    seed: int,
    extra: bool = False,
    skip: torch.Tensor | None = None,
    image_only: bool = False,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Gradients of the kernel (on its device, each in its leaf's dtype: the parameters'
    float32, bfloat16 or float16 as ``args`` holds them) and of the reference (float64, CPU,
    from the same values) of a random weighting of image, alpha and depth (``extra``: of
    means2d, depths and colors too; ``image_only``: of the image alone, as a photometric
    loss), keyed by leaf name plus ``means2d`` (the screen-space gradient). ``skip`` ([H, W]
    bool, e.g. ``decision_pixels``): pixels that get weight 0, so that no gradient depends on
    the compositing decisions taken there."""
    gen = torch.Generator().manual_seed(seed)
    h, w, n = args["height"], args["width"], args["means"].shape[0]
    weights = {
        "image": torch.randn(3, h, w, generator=gen, dtype=torch.float64),
        "alpha": torch.randn(h, w, generator=gen, dtype=torch.float64),
        "depth": torch.randn(h, w, generator=gen, dtype=torch.float64),
        "means2d": 0.01 * torch.randn(n, 2, generator=gen, dtype=torch.float64),
        "depths": torch.randn(n, generator=gen, dtype=torch.float64),
        "colors": torch.randn(n, 3, generator=gen, dtype=torch.float64),
    }
    if skip is not None:
        for key in ("image", "alpha", "depth"):
            weights[key] = torch.where(skip.cpu(), 0.0, weights[key])
    dev = args["means"].device
    leaves = {
        k: args[k].detach().clone().requires_grad_() for k in LEAVES if args.get(k) is not None
    }
    got = rasterize(**{**args, **leaves})
    _loss(
        got, {k: v.to(dev, torch.float32) for k, v in weights.items()}, extra, image_only
    ).backward()
    kernel = {k: v.grad for k, v in leaves.items()}
    kernel["means2d"] = got.means2d.grad
    ref_leaves = {k: v.detach().cpu().double().requires_grad_() for k, v in leaves.items()}
    cpu = {k: (v.cpu().double() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    ref = reference(**{**cpu, **ref_leaves})
    _loss(ref, weights, extra, image_only).backward()
    oracle = {k: v.grad for k, v in ref_leaves.items()}
    oracle["means2d"] = ref.means2d.grad
    return kernel, oracle


def errors(
    kernel: dict[str, torch.Tensor], oracle: dict[str, torch.Tensor]
) -> dict[str, dict[str, float]]:
    """Per gradient: ``rel_l2`` = ||kernel - reference|| / ||reference||, ``max_rel`` = the
    largest error over max |reference|, ``share_over`` = the share of Gaussians (rows) with
    an error beyond ELEMENT_ATOL * max |reference| (ELEMENT_ATOL_BY_DTYPE for the kernel
    gradient's dtype)."""
    out = {}
    for name, want in oracle.items():
        got = kernel[name]
        if want is None:
            want = torch.zeros_like(got, dtype=torch.float64, device="cpu")
        diff = got.detach().double().cpu() - want
        scale = float(want.abs().max()) if want.numel() else 0.0
        norm = float(want.norm())
        rows = diff.reshape(diff.shape[0], -1).abs().amax(1) if diff.numel() else diff
        out[name] = {
            "rel_l2": float(diff.norm()) / norm if norm > 0 else float(diff.norm()),
            "max_rel": float(diff.abs().max()) / scale
            if scale > 0
            else (float(diff.abs().max()) if diff.numel() else 0.0),
            "share_over": float((rows > ELEMENT_ATOL_BY_DTYPE[got.dtype] * scale).double().mean())
            if rows.numel()
            else 0.0,
        }
    return out
