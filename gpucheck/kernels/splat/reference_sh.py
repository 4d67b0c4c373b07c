"""Real spherical harmonics of degree 0–3 for view-dependent colour (3DGS convention).

The basis is the real, orthonormal SH basis with the Condon–Shortley phase, in the order
3DGS, gsplat and the PLY files use: index ``l * l + l + m`` for ``m = -l .. l``. A direction
``(x, y, z)`` is a unit vector in *world* space from the camera centre to the Gaussian's mean.
The colour of a Gaussian is ``max(sum_k sh[k] * basis[k] + 0.5, 0)`` per channel.
"""

from __future__ import annotations

import torch

__all__ = ["MAX_SH_DEGREE", "SH_C0", "num_sh_coeffs", "sh_basis", "sh_to_color"]

MAX_SH_DEGREE = 3
#: 1 / (2 sqrt(pi)): the constant degree-0 basis function.
SH_C0 = 0.28209479177387814
#: sqrt(3) / (2 sqrt(pi)).
SH_C1 = 0.4886025119029199
SH_C2 = (
    1.0925484305920792,  # sqrt(15) / (2 sqrt(pi))
    -1.0925484305920792,
    0.31539156525252005,  # sqrt(5) / (4 sqrt(pi))
    -1.0925484305920792,
    0.5462742152960396,  # sqrt(15) / (4 sqrt(pi))
)
SH_C3 = (
    -0.5900435899266435,  # sqrt(70) / (8 sqrt(pi))
    2.890611442640554,  # sqrt(105) / (2 sqrt(pi))
    -0.4570457994644658,  # sqrt(42) / (8 sqrt(pi))
    0.3731763325901154,  # sqrt(7) / (4 sqrt(pi))
    -0.4570457994644658,
    1.445305721320277,  # sqrt(105) / (4 sqrt(pi))
    -0.5900435899266435,
)


def num_sh_coeffs(degree: int) -> int:
    """Number of SH coefficients per colour channel up to ``degree``: ``(degree + 1) ** 2``."""
    return (degree + 1) ** 2


def sh_basis(dirs: torch.Tensor, degree: int) -> torch.Tensor:
    """The SH basis functions evaluated at unit directions.

    Args:
        dirs: ``[N, 3]`` unit vectors.
        degree: 0 to 3.

    Returns:
        ``[N, (degree + 1) ** 2]`` in the dtype of ``dirs``.
    """
    if not 0 <= degree <= MAX_SH_DEGREE:
        raise ValueError(f"sh degree must be in 0..{MAX_SH_DEGREE}, got {degree}")
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, SH_C0)]
    if degree >= 1:
        out += [-SH_C1 * y, SH_C1 * z, -SH_C1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        out += [
            SH_C2[0] * x * y,
            SH_C2[1] * y * z,
            SH_C2[2] * (2 * zz - xx - yy),
            SH_C2[3] * x * z,
            SH_C2[4] * (xx - yy),
        ]
    if degree >= 3:
        out += [
            SH_C3[0] * y * (3 * xx - yy),
            SH_C3[1] * x * y * z,
            SH_C3[2] * y * (4 * zz - xx - yy),
            SH_C3[3] * z * (2 * zz - 3 * xx - 3 * yy),
            SH_C3[4] * x * (4 * zz - xx - yy),
            SH_C3[5] * z * (xx - yy),
            SH_C3[6] * x * (xx - 3 * yy),
        ]
    return torch.stack(out, dim=-1)


def sh_to_color(sh: torch.Tensor, dirs: torch.Tensor, degree: int) -> torch.Tensor:
    """RGB of each Gaussian seen along ``dirs``: SH dot basis, plus 0.5, clamped at 0.

    Args:
        sh: ``[N, K, 3]`` coefficients, ``K >= (degree + 1) ** 2`` (extra ones are ignored).
        dirs: ``[N, 3]`` unit directions from the camera centre to the means.
        degree: SH degree to evaluate, 0 to 3.

    Returns:
        ``[N, 3]`` colours, ``>= 0`` (not clamped above, as in 3DGS).
    """
    basis = sh_basis(dirs, degree)  # [N, K']
    rgb = (basis.unsqueeze(-1) * sh[:, : basis.shape[1]]).sum(1)  # [N, 3]
    return (rgb + 0.5).clamp_min(0.0)
