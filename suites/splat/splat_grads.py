"""Gradients of gpucheck.ops.rasterize and of the float64 reference for one random loss, and
their differences: shared by the gradient suite (test_splat_backward.py) and the benchmark."""

from __future__ import annotations

from typing import Any

import torch

from gpucheck.ops import rasterize
from gpucheck.reference import rasterize as reference
from gpucheck.reference.splat import ALPHA_MAX, ALPHA_MIN, TILE_SIZE, project

#: Inputs that take a gradient (those of them that a scene has).
LEAVES = ("means", "scales", "rotations", "opacities", "colors", "sh", "background")
#: Where ``errors`` counts a Gaussian as off: times max |reference gradient|.
ELEMENT_ATOL = 1e-3
DEPTH_WEIGHT = 0.1
#: Relative window around the compositing decisions (alpha >= 1/255, the 0.99 clamp) within
#: which float32 and float64 may decide differently (see ``near_decision``).
DECISION_RTOL = 1e-4
_CHUNK_ELEMENTS = 1 << 21


def _loss(res: Any, weights: dict[str, torch.Tensor], extra: bool) -> torch.Tensor:
    loss = (res.image * weights["image"]).sum() + (res.alpha * weights["alpha"]).sum()
    loss = loss + DEPTH_WEIGHT * (res.depth * weights["depth"]).sum()
    if extra:  # losses on the per-Gaussian outputs (exercise splat_project's backward alone)
        loss = loss + (res.means2d * weights["means2d"]).sum() + (
            res.depths * weights["depths"]).sum() + (res.colors * weights["colors"]).sum()
    return loss


def gradients(args: dict[str, Any], seed: int, extra: bool = False
              ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Gradients of the kernel (float32, on its device) and of the reference (float64, CPU)
    of a random weighting of image, alpha and depth (``extra``: of means2d, depths and
    colors too), keyed by leaf name plus ``means2d`` (the screen-space gradient)."""
    gen = torch.Generator().manual_seed(seed)
    h, w, n = args["height"], args["width"], args["means"].shape[0]
    weights = {"image": torch.randn(3, h, w, generator=gen, dtype=torch.float64),
               "alpha": torch.randn(h, w, generator=gen, dtype=torch.float64),
               "depth": torch.randn(h, w, generator=gen, dtype=torch.float64),
               "means2d": 0.01 * torch.randn(n, 2, generator=gen, dtype=torch.float64),
               "depths": torch.randn(n, generator=gen, dtype=torch.float64),
               "colors": torch.randn(n, 3, generator=gen, dtype=torch.float64)}
    dev = args["means"].device
    leaves = {k: args[k].detach().clone().requires_grad_() for k in LEAVES
              if args.get(k) is not None}
    got = rasterize(**{**args, **leaves})
    _loss(got, {k: v.to(dev, torch.float32) for k, v in weights.items()}, extra).backward()
    kernel = {k: v.grad for k, v in leaves.items()}
    kernel["means2d"] = got.means2d.grad
    ref_leaves = {k: v.detach().cpu().double().requires_grad_() for k, v in leaves.items()}
    cpu = {k: (v.cpu().double() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    ref = reference(**{**cpu, **ref_leaves})
    _loss(ref, weights, extra).backward()
    oracle = {k: v.grad for k, v in ref_leaves.items()}
    oracle["means2d"] = ref.means2d.grad
    return kernel, oracle


def near_decision(args: dict[str, Any]) -> torch.Tensor:
    """[N] bool: the Gaussians whose ``opacity * exp(power)`` at some pixel of their tiles lies
    within a relative DECISION_RTOL of 1/255 (composited or skipped) or of the 0.99 clamp
    (opacity and exponent gradients on or off), in float64 like the reference.

    The kernel evaluates alpha in float32 (conic and screen mean rounded to float32, ``expf``):
    relative errors up to ~1e-5. At such a pixel it may take the other branch than the
    reference, which changes that Gaussian's gradient by its whole share from that pixel (for
    a close Gaussian a few 1e-4 of the gradient norm): the gradient is discontinuous there,
    the float64 reference itself moves that much when its inputs move by float32 rounding.
    """
    d = {k: (v.detach().cpu().double() if isinstance(v, torch.Tensor) else v)
         for k, v in args.items()}
    h, w = args["height"], args["width"]
    proj = project(d["means"], d["scales"], d["rotations"], d["viewmat"], d["K"], w, h)
    out = torch.zeros(d["means"].shape[0], dtype=torch.bool)
    vis = (proj.radii > 0).nonzero().flatten()
    if vis.numel() == 0:
        return out
    means2d, conics = proj.means2d[vis].detach(), proj.conics[vis].detach()
    opacities, tiles = d["opacities"][vis], proj.tiles[vis]
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // (w * vis.numel()))
    for y0 in range(0, h, rows_per_chunk):
        iy, ix = torch.meshgrid(torch.arange(y0, min(h, y0 + rows_per_chunk)),
                                torch.arange(w), indexing="ij")
        iy, ix = iy.reshape(-1, 1), ix.reshape(-1, 1)
        dx = means2d[:, 0] - (ix + 0.5)
        dy = means2d[:, 1] - (iy + 0.5)
        power = -0.5 * (conics[:, 0] * dx * dx + conics[:, 2] * dy * dy) - conics[:, 1] * dx * dy
        tx, ty = ix // TILE_SIZE, iy // TILE_SIZE
        covers = ((tx >= tiles[:, 0]) & (ty >= tiles[:, 1]) & (tx < tiles[:, 2])
                  & (ty < tiles[:, 3]) & (power <= 0))
        raw = opacities * torch.exp(power)
        near = ((raw - ALPHA_MIN).abs() <= DECISION_RTOL * ALPHA_MIN) | (
            (raw - ALPHA_MAX).abs() <= DECISION_RTOL * ALPHA_MAX)
        out[vis[(covers & near).any(0)]] = True
    return out


def errors(kernel: dict[str, torch.Tensor], oracle: dict[str, torch.Tensor],
           exempt: torch.Tensor | None = None) -> dict[str, dict[str, float]]:
    """Per gradient: ``rel_l2`` = ||kernel - reference|| / ||reference|| over the Gaussians
    (rows) not in ``exempt`` ([N] bool, e.g. ``near_decision``; every row when None),
    ``max_rel`` = the largest error over max |reference|, ``share_over`` = the share of
    Gaussians with an error beyond ELEMENT_ATOL * max |reference| (these two over all rows)."""
    out = {}
    for name, want in oracle.items():
        got = kernel[name]
        if want is None:
            want = torch.zeros_like(got, dtype=torch.float64, device="cpu")
        diff = got.detach().double().cpu() - want
        scale = float(want.abs().max()) if want.numel() else 0.0
        keep_diff, keep_want = diff, want
        if exempt is not None and diff.dim() and diff.shape[0] == exempt.shape[0]:
            keep_diff, keep_want = diff[~exempt], want[~exempt]
        norm = float(keep_want.norm())
        rows = diff.reshape(diff.shape[0], -1).abs().amax(1) if diff.numel() else diff
        out[name] = {
            "rel_l2": (float(keep_diff.norm()) / norm if norm > 0
                       else float(keep_diff.norm())),
            "max_rel": float(diff.abs().max()) / scale if scale > 0 else (
                float(diff.abs().max()) if diff.numel() else 0.0),
            "share_over": float((rows > ELEMENT_ATOL * scale).double().mean())
            if rows.numel() else 0.0,
        }
    return out
