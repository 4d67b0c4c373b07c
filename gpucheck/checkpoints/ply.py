"""3DGS ``point_cloud.ply`` files: read (tolerantly) and write (exactly as 3DGS does).

Layout of the ``vertex`` element, one row per Gaussian, float32, binary little-endian::

    x y z nx ny nz f_dc_0..2 f_rest_0..M-1 opacity scale_0..2 rot_0..3

``nx ny nz`` are zeros (3DGS writes them and never reads them). ``f_rest`` is channel-major:
``f_rest_{c * K + k}`` is coefficient ``k`` of channel ``c`` (all red coefficients, then green,
then blue), ``K = M / 3 = (d + 1)^2 - 1`` for SH degree ``d``. Values are raw: log-scales,
opacity logits, unnormalized wxyz quaternions.

The reader also accepts ASCII and big-endian files, any numeric property types, extra
properties and elements (ignored), and SH degrees 0–3 (inferred from the ``f_rest`` count).
Every problem is reported as :class:`gpucheck.errors.CheckpointError` naming it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from plyfile import PlyData, PlyElement

from gpucheck.checkpoints.layout import SCALAR_FIELDS as _SCALAR_FIELDS
from gpucheck.checkpoints.layout import parse, sh_degree_of, vertex_layout
from gpucheck.checkpoints.model import GaussianParams, check_finite
from gpucheck.errors import CheckpointError

__all__ = ["parse", "read_ply", "vertex_layout", "write_ply"]


def _column(vertex: PlyElement, name: str) -> np.ndarray:
    data = vertex[name]
    if data.dtype.kind not in "fiu":
        raise CheckpointError(f"property {name} is not a numeric scalar ({data.dtype})")
    return np.ascontiguousarray(data, dtype=np.float32)  # a copy: native, unstrided


def read_ply(path: str | Path) -> GaussianParams:
    """Read a 3DGS PLY checkpoint.

    Args:
        path: the ``.ply`` file.

    Returns:
        Validated :class:`GaussianParams` (float32), ``sh_degree`` = the degree the file holds.

    Raises:
        CheckpointError: not a PLY, malformed header, truncated, no ``vertex`` element,
            missing properties (all listed), an ``f_rest`` count that is not
            ``3 * ((d + 1)^2 - 1)`` for ``d <= 3``, or NaN/inf values (fields and counts).
    """
    path = Path(path)
    ply = parse(path)
    vertex, count = vertex_layout(ply, path)
    rest_per_channel = count // 3
    try:
        cols = {f: _column(vertex, f) for f in _SCALAR_FIELDS}
        rest = {f"f_rest_{i}": _column(vertex, f"f_rest_{i}") for i in range(count)}
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from e
    cols |= rest
    check_finite({k: torch.from_numpy(v) for k, v in cols.items()}, str(path))
    n = len(vertex.data)

    def stack(fields: list[str]) -> torch.Tensor:
        if not fields:
            return torch.zeros(n, 0)
        return torch.from_numpy(np.stack([cols[f] for f in fields], axis=1))

    rest_flat = stack([f"f_rest_{i}" for i in range(count)])  # [N, 3 * K]
    params = GaussianParams(
        means=stack(["x", "y", "z"]),
        features_dc=stack(["f_dc_0", "f_dc_1", "f_dc_2"]).reshape(n, 1, 3),
        features_rest=rest_flat.reshape(n, 3, rest_per_channel).transpose(1, 2).contiguous(),
        log_scales=stack(["scale_0", "scale_1", "scale_2"]),
        opacity_logits=stack(["opacity"]).reshape(n),
        rotations_raw=stack(["rot_0", "rot_1", "rot_2", "rot_3"]),
        sh_degree=sh_degree_of(rest_per_channel) or 0,
    )
    return params.validate(str(path))


def write_ply(params: GaussianParams, path: str | Path) -> None:
    """Write ``params`` as a 3DGS PLY (binary little-endian float32, 3DGS's property order).

    The active ``sh_degree`` is not stored (3DGS's PLY has no field for it); the reader sets
    it to the degree of ``features_rest``.

    Raises:
        CheckpointError: ``params`` are invalid (shapes, NaN/inf) or the file cannot be written.
    """
    path = Path(path)
    params.validate(f"{path}: refusing to write")
    n = params.num_gaussians
    k = int(params.features_rest.shape[1])
    columns = [
        params.means,
        torch.zeros(n, 3),
        params.features_dc.reshape(n, 3),
        params.features_rest.transpose(1, 2).reshape(n, 3 * k),  # channel-major
        params.opacity_logits.reshape(n, 1),
        params.log_scales,
        params.rotations_raw,
    ]
    table = torch.cat([c.detach().cpu().to(torch.float32) for c in columns], dim=1).numpy()
    names = (
        ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
        + [f"f_rest_{i}" for i in range(3 * k)]
        + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    )
    rows = np.empty(n, dtype=[(name, "<f4") for name in names])
    for i, name in enumerate(names):
        rows[name] = table[:, i]
    ply = PlyData([PlyElement.describe(rows, "vertex")], text=False, byte_order="<")
    try:
        ply.write(str(path))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write: {e.strerror or e}") from e
