"""A small Gaussian-splatting model for the distributed checks, on any device.

Raw parameters as 3DGS stores them (means, log-scales, quaternions, opacity logits) plus a
per-Gaussian feature vector and a linear colour head (so that autocast has a matmul to lower
to bf16/fp16). On CUDA it renders with gpucheck's kernels (``gpucheck.ops.rasterize`` and
``gpucheck.ops.ssim``), on the CPU with the pure-PyTorch references, which is what lets the
gloo checks run in CI.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

FEATURES = 8


def look_at(eye: torch.Tensor) -> torch.Tensor:
    """[4, 4] world -> camera (OpenCV axes) of a camera at ``eye`` looking at the origin."""
    forward = -eye / eye.norm()
    up = torch.tensor([0.0, 1.0, 0.0], dtype=eye.dtype)
    right = torch.linalg.cross(forward, up)
    right = right / right.norm()
    down = torch.linalg.cross(forward, right)
    rot = torch.stack([right, down, forward])  # rows: camera axes in world coordinates
    view = torch.eye(4, dtype=eye.dtype)
    view[:3, :3] = rot
    view[:3, 3] = -rot @ eye
    return view


def cameras(count: int, size: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` (viewmat, K) pairs (float32, CPU) around the origin at distance ~4."""
    gen = torch.Generator().manual_seed(seed)
    f = 0.5 * size / math.tan(math.radians(30))
    K = torch.tensor([[f, 0.0, size / 2 + 0.3], [0.0, f, size / 2 - 0.2], [0.0, 0.0, 1.0]])
    out = []
    for i in range(count):
        angle = 2 * math.pi * (i + float(torch.rand(1, generator=gen))) / count
        eye = torch.tensor(
            [4 * math.sin(angle), 0.6 * float(torch.randn(1, generator=gen)), -4 * math.cos(angle)],
            dtype=torch.float64,
        )
        out.append((look_at(eye).float(), K.clone()))
    return out


def gaussians(n: int, seed: int) -> dict[str, torch.Tensor]:
    """Raw parameters of ``n`` Gaussians in a unit ball (float32, CPU)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "means": (torch.rand(n, 3, generator=gen) * 2 - 1) * 0.9,
        "log_scales": torch.rand(n, 3, generator=gen) * 1.2 - 2.8,
        "quats": torch.randn(n, 4, generator=gen),
        "opacity_logits": torch.randn(n, generator=gen),
        "features": torch.randn(n, FEATURES, generator=gen),
    }


class SplatModel(nn.Module):
    """Gaussians + a colour head; ``forward(viewmat, K, size)`` renders one [3, size, size]."""

    means: nn.Parameter  # [N, 3]
    log_scales: nn.Parameter  # [N, 3]
    quats: nn.Parameter  # [N, 4] wxyz, any norm
    opacity_logits: nn.Parameter  # [N]
    features: nn.Parameter  # [N, FEATURES]

    def __init__(self, n: int, seed: int) -> None:
        super().__init__()
        for name, value in gaussians(n, seed).items():
            self.register_parameter(name, nn.Parameter(value))
        gen = torch.Generator().manual_seed(seed + 1)
        self.head = nn.Linear(FEATURES, 3)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(3, FEATURES, generator=gen) * 0.3)
            self.head.bias.copy_(torch.randn(3, generator=gen) * 0.1)

    def activated(self) -> dict[str, torch.Tensor]:
        """Rasterizer inputs (float32 whatever autocast did to the colour head)."""
        colors = torch.sigmoid(self.head(self.features)).float()
        return {
            "means": self.means,
            "scales": torch.exp(self.log_scales),
            "rotations": self.quats,
            "opacities": torch.sigmoid(self.opacity_logits),
            "colors": colors,
        }

    def forward(self, viewmat: torch.Tensor, K: torch.Tensor, size: int) -> torch.Tensor:
        return render(self.activated(), viewmat, K, size)


def render(
    g: dict[str, torch.Tensor], viewmat: torch.Tensor, K: torch.Tensor, size: int
) -> torch.Tensor:
    """[3, size, size] image of activated Gaussians ``g`` (CUDA kernels or CPU reference)."""
    dev = g["means"].device
    kwargs: dict[str, Any] = dict(
        colors=g["colors"], viewmat=viewmat.to(dev), K=K.to(dev), width=size, height=size
    )
    if dev.type == "cuda":
        from gpucheck.ops import rasterize

        return rasterize(g["means"], g["scales"], g["rotations"], g["opacities"], **kwargs).image
    from gpucheck.reference import rasterize as ref_rasterize

    return ref_rasterize(g["means"], g["scales"], g["rotations"], g["opacities"], **kwargs).image


def ssim_loss(
    image: torch.Tensor, target: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """1 - SSIM of two [3, H, W] images, in ``dtype`` (default the image's)."""
    a = image[None].to(dtype or image.dtype)
    b = target[None].to(a.dtype)
    if a.is_cuda:
        from gpucheck.ops import ssim

        return 1 - ssim(a, b)
    from gpucheck.reference import ssim as ref_ssim

    return 1 - ref_ssim(a, b)


def targets(
    views: list[tuple[torch.Tensor, torch.Tensor]], size: int, n: int = 64, seed: int = 99
) -> list[torch.Tensor]:
    """Target images of ``views``: a different scene, rendered by the CPU reference."""
    model = SplatModel(n, seed)
    with torch.no_grad():
        return [model(v, k, size).float() for v, k in views]
