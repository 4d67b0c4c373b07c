"""``GaussianParams``: the raw (as optimized) parameters of a 3DGS scene, as checkpoints hold them.

Shapes follow 3DGS's ``GaussianModel``: ``features_dc`` ``[N, 1, 3]`` and ``features_rest``
``[N, (d + 1)^2 - 1, 3]`` for SH degree ``d``; opacity logits are kept as ``[N]`` (3DGS uses
``[N, 1]``; the .pt writer restores that shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch

from gpucheck.checkpoints.activations import (
    opacity_activation,
    rotation_activation,
    scale_activation,
)
from gpucheck.checkpoints.layout import MAX_SH_DEGREE, sh_degree_of
from gpucheck.errors import CheckpointError

__all__ = ["MAX_SH_DEGREE", "ActivatedGaussians", "GaussianParams", "check_finite", "sh_degree_of"]


class ActivatedGaussians(NamedTuple):
    """Inputs of ``gpucheck.reference.rasterize``: ``rasterize(**g._asdict(), viewmat=...)``."""

    means: torch.Tensor  #: [N, 3]
    scales: torch.Tensor  #: [N, 3] positive
    rotations: torch.Tensor  #: [N, 4] unit wxyz
    opacities: torch.Tensor  #: [N] in [0, 1]
    sh: torch.Tensor  #: [N, (d + 1)^2, 3], dc first
    sh_degree: int


def check_finite(named: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise :class:`CheckpointError` naming every field that holds NaN/inf and how many."""
    bad = []
    for name, t in named.items():
        n = int((~torch.isfinite(t)).sum())
        if n:
            bad.append(f"{name} ({n} of {t.numel()})")
    if bad:
        raise CheckpointError(f"{source}: NaN/inf values in {', '.join(bad)}")


@dataclass
class GaussianParams:
    """Raw 3DGS parameters (CPU tensors, usually float32)."""

    means: torch.Tensor  #: [N, 3] world-space centres (3DGS ``_xyz``)
    features_dc: torch.Tensor  #: [N, 1, 3] degree-0 SH (``_features_dc``)
    features_rest: torch.Tensor  #: [N, (d+1)^2-1, 3] higher SH (``_features_rest``)
    log_scales: torch.Tensor  #: [N, 3] (``_scaling``)
    opacity_logits: torch.Tensor  #: [N] (``_opacity`` flattened)
    rotations_raw: torch.Tensor  #: [N, 4] wxyz, any norm (``_rotation``)
    sh_degree: int  #: active SH degree, at most :attr:`max_sh_degree`

    @property
    def num_gaussians(self) -> int:
        return int(self.means.shape[0])

    @property
    def max_sh_degree(self) -> int:
        """SH degree that ``features_rest`` holds coefficients for."""
        d = sh_degree_of(int(self.features_rest.shape[1]))
        if d is None:
            raise CheckpointError(
                f"features_rest {list(self.features_rest.shape)} does not "
                f"hold (d + 1)^2 - 1 coefficients for a degree d <= 3"
            )
        return d

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensor fields by name, in declaration order."""
        return {
            "means": self.means,
            "features_dc": self.features_dc,
            "features_rest": self.features_rest,
            "log_scales": self.log_scales,
            "opacity_logits": self.opacity_logits,
            "rotations_raw": self.rotations_raw,
        }

    def validate(self, source: str = "GaussianParams", *, finite: bool = True) -> GaussianParams:
        """Check types, shapes, the SH degree and (``finite``) finiteness; return self.

        Raises:
            CheckpointError: the message starts with ``source`` (e.g. a file path) and names
                the offending field with its shape.
        """
        named = self.tensors()
        for name, t in named.items():
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                kind = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
                raise CheckpointError(
                    f"{source}: {name} must be a floating-point tensor, got {kind}"
                )
        n = self.num_gaussians
        want = {
            "means": (n, 3),
            "features_dc": (n, 1, 3),
            "log_scales": (n, 3),
            "opacity_logits": (n,),
            "rotations_raw": (n, 4),
        }
        wrong = [
            f"{k} is {list(named[k].shape)}, expected {list(s)}"
            for k, s in want.items()
            if tuple(named[k].shape) != s
        ]
        rest = self.features_rest
        if (
            rest.dim() != 3
            or rest.shape[0] != n
            or rest.shape[2] != 3
            or (sh_degree_of(int(rest.shape[1])) is None)
        ):
            wrong.append(
                f"features_rest is {list(rest.shape)}, expected [{n}, K, 3] with "
                f"K = (d + 1)^2 - 1 in (0, 3, 8, 15)"
            )
        if self.means.dim() != 2:
            wrong.insert(0, f"means is {list(self.means.shape)}, expected [N, 3]")
        if wrong:
            raise CheckpointError(f"{source}: wrong tensor shapes: {'; '.join(wrong)}")
        if (
            isinstance(self.sh_degree, bool)
            or not isinstance(self.sh_degree, int)
            or not (0 <= self.sh_degree <= self.max_sh_degree)
        ):
            raise CheckpointError(
                f"{source}: sh_degree must be an int in "
                f"0..{self.max_sh_degree}, got {self.sh_degree!r}"
            )
        if finite:
            check_finite(named, source)
        return self

    def activated(self) -> ActivatedGaussians:
        """The activated values ``gpucheck.reference.rasterize`` takes (see ``activations``)."""
        return ActivatedGaussians(
            means=self.means,
            scales=scale_activation(self.log_scales),
            rotations=rotation_activation(self.rotations_raw),
            opacities=opacity_activation(self.opacity_logits),
            sh=torch.cat([self.features_dc, self.features_rest], dim=1),
            sh_degree=self.sh_degree,
        )
