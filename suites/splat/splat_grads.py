"""Gradients of gpucheck.ops.rasterize and of the float64 reference for one random loss, and
their differences: shared by the gradient suite (test_splat_backward.py) and the benchmark."""

from __future__ import annotations

from typing import Any

import torch

from gpucheck.ops import rasterize
from gpucheck.reference import rasterize as reference

#: Inputs that take a gradient (those of them that a scene has).
LEAVES = ("means", "scales", "rotations", "opacities", "colors", "sh", "background")
#: Where ``errors`` counts a Gaussian as off: times max |reference gradient|.
ELEMENT_ATOL = 1e-3
DEPTH_WEIGHT = 0.1


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


def errors(kernel: dict[str, torch.Tensor], oracle: dict[str, torch.Tensor]
           ) -> dict[str, dict[str, float]]:
    """Per gradient: ``rel_l2`` = ||kernel - reference|| / ||reference||, ``max_rel`` = the
    largest error over max |reference|, ``share_over`` = the share of Gaussians (rows) with
    an error beyond ELEMENT_ATOL * max |reference|."""
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
            "max_rel": float(diff.abs().max()) / scale if scale > 0 else (
                float(diff.abs().max()) if diff.numel() else 0.0),
            "share_over": float((rows > ELEMENT_ATOL * scale).double().mean())
            if rows.numel() else 0.0,
        }
    return out
