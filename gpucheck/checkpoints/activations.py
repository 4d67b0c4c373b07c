"""The one place that defines how 3DGS's raw parameters become what a rasterizer takes.

3DGS optimizes unconstrained parameters and activates them before rendering:

* scales: stored as log-scales, activated with ``exp`` (inverse: ``log``);
* opacities: stored as logits, activated with ``sigmoid`` (inverse: ``logit``);
* rotations: stored as raw quaternions ``(w, x, y, z)``, activated by normalizing (a unit
  quaternion is its own raw form, so the inverse only normalizes).

Activating twice (``exp(exp(log_s))``) is the bug behind a 30k-iteration scene asking for
52 GiB on resume: every Gaussian grows to cover every screen tile. Code that moves parameters
between raw and activated form should go through these functions and nothing else.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "inverse_opacity_activation",
    "inverse_rotation_activation",
    "inverse_scale_activation",
    "opacity_activation",
    "rotation_activation",
    "scale_activation",
]


def scale_activation(log_scales: torch.Tensor) -> torch.Tensor:
    """``[N, 3]`` log-scales → positive scales (``exp``)."""
    return torch.exp(log_scales)


def inverse_scale_activation(scales: torch.Tensor) -> torch.Tensor:
    """``[N, 3]`` positive scales → log-scales (``log``)."""
    return torch.log(scales)


def opacity_activation(logits: torch.Tensor) -> torch.Tensor:
    """``[N]`` opacity logits → opacities in ``[0, 1]`` (``sigmoid``)."""
    return torch.sigmoid(logits)


def inverse_opacity_activation(opacities: torch.Tensor) -> torch.Tensor:
    """``[N]`` opacities in ``(0, 1)`` → logits (``log(p / (1 - p))``)."""
    return torch.logit(opacities)


def rotation_activation(quats: torch.Tensor) -> torch.Tensor:
    """``[N, 4]`` raw wxyz quaternions → unit quaternions."""
    return F.normalize(quats, dim=-1)


def inverse_rotation_activation(quats: torch.Tensor) -> torch.Tensor:
    """``[N, 4]`` unit quaternions → raw quaternions (normalized: any scale is valid)."""
    return F.normalize(quats, dim=-1)
