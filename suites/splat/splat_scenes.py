"""Random Gaussian-splatting scenes for the splat suite and its benchmark (float32, any device;
``to`` gives a scene's parameters another dtype).

Every scene is built in camera space (so that we control what is in front of the camera, what
is off-screen and how large the Gaussians look) and moved to world space through a random
view matrix; the arguments are what ``rasterize`` takes.
"""

from __future__ import annotations

import math
from typing import Any

import torch

F32 = torch.float32

#: The benchmark scenes (``benchmarks/splat.py --scene``; 1920x1080, SH degree 3): keyword
#: arguments of :func:`scene`. ``bench``: the scenes of the recorded results since the first
#: benchmark (screen radii of a few pixels, opacities uniform in [0.05, 1]). ``midtrain``: a
#: scene as it looks mid-training, larger Gaussians (log-scales -4.5...-2.5, about 1.6x the
#: radii) and opacities spread wide (sigmoid of N(0, 3) logits: many near 0 and near 1).
BENCH_SCENES: dict[str, dict[str, Any]] = {
    "bench": dict(sh_degree=3, depth_range=(2.0, 30.0), log_scale=(-5.0, -3.0)),
    "midtrain": dict(
        sh_degree=3, depth_range=(2.0, 30.0), log_scale=(-4.5, -2.5), opacity_logit_std=3.0
    ),
}


def random_viewmat(gen: torch.Generator) -> torch.Tensor:
    """[4, 4] float64 world -> camera: a random rotation and translation."""
    q = torch.nn.functional.normalize(torch.randn(4, generator=gen, dtype=torch.float64), dim=0)
    w, x, y, z = q.tolist()
    rot = torch.tensor(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ],
        dtype=torch.float64,
    )
    view = torch.eye(4, dtype=torch.float64)
    view[:3, :3] = rot
    view[:3, 3] = torch.randn(3, generator=gen, dtype=torch.float64)
    return view


def scene(
    n: int,
    width: int,
    height: int,
    seed: int,
    device: torch.device | str = "cpu",
    *,
    sh_degree: int | None = None,
    depth_range: tuple[float, float] = (1.0, 6.0),
    spread: float = 1.3,
    log_scale: tuple[float, float] = (-4.5, -1.5),
    pixel_size: float | None = None,
    opacity_logit_std: float | None = None,
) -> dict[str, Any]:
    """A random scene: keyword arguments of ``rasterize`` (float32 tensors on ``device``).

    Means lie in the frustum widened by ``spread`` (so some are off-screen) at camera depths in
    ``depth_range``; log-scales are uniform in ``log_scale``; opacities in [0.05, 1]; colours
    in [0, 1] or SH coefficients (dc around 0.3, higher orders smaller) when ``sh_degree`` is
    given; a random background. ``pixel_size``: focal length such that one world unit at depth
    1 spans this many pixels (default: a 60-degree horizontal field of view).
    ``opacity_logit_std``: opacities ``sigmoid(N(0, std))`` instead (drawn after everything
    else, so the rest of the scene is the same).
    """
    gen = torch.Generator().manual_seed(seed)
    f = pixel_size if pixel_size is not None else 0.5 * width / math.tan(math.radians(30))
    K = torch.tensor(
        [[f, 0.0, width / 2 + 0.37], [0.0, f * 1.05, height / 2 - 0.21], [0.0, 0.0, 1.0]],
        dtype=torch.float64,
    )
    z = depth_range[0] + (depth_range[1] - depth_range[0]) * torch.rand(
        n, generator=gen, dtype=torch.float64
    )
    half_x, half_y = spread * 0.5 * width / f, spread * 0.5 * height / K[1, 1]
    cam = torch.stack(
        [
            (2 * torch.rand(n, generator=gen, dtype=torch.float64) - 1) * half_x * z,
            (2 * torch.rand(n, generator=gen, dtype=torch.float64) - 1) * half_y * z,
            z,
        ],
        dim=1,
    )
    view = random_viewmat(gen)
    inv = torch.linalg.inv(view)
    means = cam @ inv[:3, :3].T + inv[:3, 3]
    lo, hi = log_scale
    scales = torch.exp(lo + (hi - lo) * torch.rand(n, 3, generator=gen, dtype=torch.float64))
    out: dict[str, Any] = dict(
        means=means,
        scales=scales,
        rotations=torch.randn(n, 4, generator=gen),
        opacities=0.05 + 0.95 * torch.rand(n, generator=gen),
        viewmat=view,
        K=K,
        width=width,
        height=height,
        background=torch.rand(3, generator=gen),
    )
    if sh_degree is None:
        out["colors"] = torch.rand(n, 3, generator=gen)
    else:
        k = (sh_degree + 1) ** 2
        sh = 0.2 * torch.randn(n, k, 3, generator=gen)
        sh[:, 0] += 0.3
        out["sh"] = sh
    if opacity_logit_std is not None:
        out["opacities"] = torch.sigmoid(opacity_logit_std * torch.randn(n, generator=gen))
    return to(out, device)


#: The camera's tensors, float32 whatever the Gaussian parameters' dtype.
CAMERA = ("viewmat", "K")


def to(
    args: dict[str, Any], device: torch.device | str, dtype: torch.dtype = F32
) -> dict[str, Any]:
    """The same scene with every tensor contiguous on ``device``: the Gaussian parameters as
    ``dtype`` (float32, bfloat16 or float16: rounded to nearest), the camera as float32.
    (A half scene's values are exact in float32 and float64, so ``to(half, "cpu")`` gives the
    reference the very values the kernel got.)"""
    return {
        k: (
            v.to(device=device, dtype=F32 if k in CAMERA else dtype).contiguous()
            if isinstance(v, torch.Tensor)
            else v
        )
        for k, v in args.items()
    }
