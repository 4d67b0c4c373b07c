"""What rendering a checkpoint would cost, loaded with 3DGS conventions and loaded correctly.

``lint-checkpoint --render WxH`` frames the scene with a camera (60° horizontal field of view,
on the scene's median centre, backed off until the 2nd..98th percentile box fits) and counts
the Gaussian-tile overlaps a tiled rasterizer bins, and the bytes its binning buffers need
(``gpucheck.kernels.splat.reference.BYTES_PER_INTERSECTION`` per overlap), for two loads of
the same stored values: *3DGS load* (``exp`` of the stored scales) and *as stored* (the scales
taken as already activated). The lint's verdict says which one is the correct load.

Where a CUDA device and gpucheck's compiled rasterizer are available, the count comes from the
rasterizer's own memory preflight (``gpucheck.ops.rasterize`` with a 0-byte budget: it counts
the overlaps on the GPU and raises ``MemoryAnomalyError`` before allocating anything);
otherwise from the pure-PyTorch projection of :mod:`gpucheck.kernels.splat.reference` on the
CPU (the same radius and tile rules), a block of Gaussians at a time. The report names the
method used.
Both count every Gaussian as opaque (``OPACITY``): the largest binning any opacities give.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from gpucheck.kernels.splat.reference import (
    BYTES_PER_INTERSECTION,
    TILE_SIZE,
    estimate_binning_bytes,
    project,
)

__all__ = ["camera_for", "estimate", "overlaps"]

FOV_X_DEG = 60.0
BLOCK = 1 << 18
#: a Gaussian covering more than this share of the image's tiles counts as huge
HUGE_SHARE = 0.25
#: The opacity both counts give every Gaussian: the rasterizer bins a Gaussian into the tiles
#: where it can reach alpha >= 1/255, which grow with its opacity, so opaque ones give the
#: largest count (an upper bound over the file's real opacities, which neither load changes).
OPACITY = 1.0
METHOD = (
    "CPU estimate: gpucheck.kernels.splat.reference.project (pure PyTorch, same radius and tile "
    "rules as the CUDA kernel's preflight)"
)
PREFLIGHT = "the splat rasterizer's memory preflight on {device} (gpucheck.ops.rasterize)"


def camera_for(means: np.ndarray, width: int, height: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``viewmat`` [4, 4] and ``K`` [3, 3] (float64) of a camera looking along +z at the
    scene's median centre from far enough back that the 2nd..98th percentile box fits."""
    ok = means[np.isfinite(means).all(axis=1)]
    if len(ok) == 0:
        ok = np.zeros((1, 3), np.float32)
    centre = np.median(ok, axis=0).astype(np.float64)
    lo, hi = np.percentile(ok, [2, 98], axis=0) if len(ok) > 1 else (centre, centre)
    half = max(float(np.max(hi - lo)) / 2, 1e-3)
    fx = 0.5 * width / math.tan(math.radians(FOV_X_DEG) / 2)
    fov_y = 2 * math.atan(0.5 * height / fx)
    dist = half / math.tan(min(math.radians(FOV_X_DEG), fov_y) / 2) + half
    viewmat = torch.eye(4, dtype=torch.float64)
    viewmat[:3, 3] = torch.tensor([-centre[0], -centre[1], -centre[2] + dist])
    K = torch.tensor([[fx, 0, width / 2], [0, fx, height / 2], [0, 0, 1]], dtype=torch.float64)
    return viewmat, K


def overlaps(
    means: np.ndarray,
    scales: np.ndarray,
    rotations: np.ndarray,
    viewmat: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
) -> dict[str, Any]:
    """Overlaps, bytes, visible count, radius percentiles and the share of huge Gaussians of
    activated ``scales`` (world units, [N, 3]) with raw ``rotations`` [N, 4]."""
    tiles_total = math.ceil(width / TILE_SIZE) * math.ceil(height / TILE_SIZE)
    total, visible, huge = 0, 0, 0
    radii: list[np.ndarray] = []
    for start in range(0, len(means), BLOCK):
        m = torch.from_numpy(np.ascontiguousarray(means[start : start + BLOCK])).double()
        s = torch.from_numpy(np.ascontiguousarray(scales[start : start + BLOCK])).double()
        q = torch.from_numpy(np.ascontiguousarray(rotations[start : start + BLOCK])).double()
        q = q / q.norm(dim=1, keepdim=True).clamp_min(1e-30)
        fin = torch.isfinite(m).all(1) & torch.isfinite(s).all(1) & torch.isfinite(q).all(1)
        if not bool(fin.all()):
            m, s, q = m[fin], s[fin], q[fin]
        p = project(
            m,
            s.clamp_max(1e30),
            q,
            viewmat,
            K,
            width,
            height,
            torch.full((m.shape[0],), OPACITY, dtype=m.dtype),
        )
        count = (p.tiles[:, 2] - p.tiles[:, 0]).clamp_min(0).long() * (
            p.tiles[:, 3] - p.tiles[:, 1]
        ).clamp_min(0).long()
        total += int(count.sum())
        visible += int((p.radii > 0).sum())
        huge += int((count > HUGE_SHARE * tiles_total).sum())
        radii.append(p.radii[p.radii > 0].numpy())
    r = np.concatenate(radii) if radii else np.zeros(0)
    pct = (
        {
            k: int(v)
            for k, v in zip(
                ("p50", "p90", "p99", "max"), np.percentile(r, [50, 90, 99, 100]), strict=True
            )
        }
        if r.size
        else {"p50": 0, "p90": 0, "p99": 0, "max": 0}
    )
    return {
        "overlaps": total,
        "bytes": estimate_binning_bytes(total),
        "visible": visible,
        "radius_percentiles_px": pct,
        "share_huge": huge / max(len(means), 1),
        "tiles": tiles_total,
    }


def _preflight(
    means: np.ndarray,
    scales: np.ndarray,
    rotations: np.ndarray,
    viewmat: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
) -> dict[str, Any] | None:
    """The CUDA rasterizer's own count (None when there is no GPU or no built extension, or
    it could not run: the CPU estimate is used then)."""
    if not torch.cuda.is_available():
        return None
    try:
        from gpucheck._csrc import extension
        from gpucheck.errors import MemoryAnomalyError
        from gpucheck.kernels.splat.op import rasterize

        if not extension.available():
            return None
        dev = torch.device("cuda", torch.cuda.current_device())
        ok = (
            np.isfinite(means).all(1)
            & np.isfinite(scales).all(1)
            & np.isfinite(rotations).all(1)
            & (np.abs(rotations).sum(1) > 0)
        )
        m, s, q = (
            torch.from_numpy(np.ascontiguousarray(a[ok], np.float32)).to(dev)
            for a in (means, scales, rotations)
        )
        n = int(m.shape[0])
        try:
            rasterize(
                m,
                s.clamp(1e-30, 1e30),
                q / q.norm(dim=1, keepdim=True),
                torch.full((n,), OPACITY, device=dev),
                colors=torch.zeros(n, 3, device=dev),
                viewmat=viewmat.float().to(dev),
                K=K.float().to(dev),
                width=width,
                height=height,
                max_bytes=0,
            )
        except MemoryAnomalyError as err:
            if err.overlaps is None:
                return None
            tiles = math.ceil(width / TILE_SIZE) * math.ceil(height / TILE_SIZE)
            return {
                "overlaps": err.overlaps,
                "bytes": estimate_binning_bytes(err.overlaps),
                "visible": err.visible,
                "radius_percentiles_px": err.radius_percentiles,
                "share_huge": err.large_share,
                "tiles": tiles,
                "method": PREFLIGHT.format(device=dev),
            }
        return None  # no overlap at all: nothing to bin, the CPU count says the same
    except Exception:  # an extension that does not load, a refused input: the CPU count
        return None


def _count(
    means: np.ndarray,
    scales: np.ndarray,
    rotations: np.ndarray,
    viewmat: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
) -> dict[str, Any]:
    found = _preflight(means, scales, rotations, viewmat, K, width, height)
    if found is None:
        found = {**overlaps(means, scales, rotations, viewmat, K, width, height), "method": METHOD}
    return found


def estimate(
    means: np.ndarray,
    stored_scales: np.ndarray,
    rotations: np.ndarray,
    size: tuple[int, int],
    scales_activated: bool,
) -> dict[str, Any]:
    """The ``render`` part of a lint report: both loads of the stored scales, which one is
    correct (the one the lint's scale verdict implies), and the method used. When the scales
    are raw, the 3DGS load is the correct one and the only one computed."""
    width, height = size
    viewmat, K = camera_for(means, width, height)
    as_3dgs = np.exp(np.minimum(stored_scales.astype(np.float64), 700.0))
    loads = {"3dgs_load": _count(means, as_3dgs, rotations, viewmat, K, width, height)}
    if scales_activated:  # the correct load takes the stored scales as they are
        loads["as_stored"] = _count(means, stored_scales, rotations, viewmat, K, width, height)
    methods = list(dict.fromkeys(str(v.pop("method")) for v in loads.values()))
    return {
        "method": "; ".join(methods),
        "width": width,
        "height": height,
        "bytes_per_overlap": BYTES_PER_INTERSECTION,
        "camera": {"fov_x_deg": FOV_X_DEG, "viewmat": viewmat.tolist(), "K": K.tolist()},
        "correct_load": "as_stored" if scales_activated else "3dgs_load",
        **loads,
    }
