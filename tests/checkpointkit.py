"""Checkpoints written without the package's writers, for the tests of what reads them:
trained-like Gaussian parameters, their PLY columns, PLY files built byte by byte, and 3DGS
capture tuples built as 3DGS's train.py saves them."""

from __future__ import annotations

import numpy as np
import torch

from gpucheck.checkpoints import GaussianParams

PLY_TYPES = {"float": "f4", "double": "f8", "uchar": "u1", "int": "i4", "short": "i2"}


def trained_like(n: int, degree: int, gen: torch.Generator) -> GaussianParams:
    """Raw parameters that look like a trained 3DGS scene (log-scales ~ -5, wide logits)."""
    k = (degree + 1) ** 2 - 1
    return GaussianParams(
        means=torch.randn(n, 3, generator=gen),
        features_dc=torch.randn(n, 1, 3, generator=gen),
        features_rest=0.1 * torch.randn(n, k, 3, generator=gen),
        log_scales=-5 + torch.randn(n, 3, generator=gen),
        opacity_logits=3 * torch.randn(n, generator=gen),
        rotations_raw=torch.randn(n, 4, generator=gen),
        sh_degree=degree,
    )


def ply_columns(p: GaussianParams) -> dict[str, np.ndarray]:
    """3DGS's vertex layout, spelled out coefficient by coefficient (channel-major f_rest)."""
    cols: dict[str, np.ndarray] = {}
    for i, axis in enumerate("xyz"):
        cols[axis] = p.means[:, i].numpy()
    for axis in ("nx", "ny", "nz"):
        cols[axis] = np.zeros(p.num_gaussians, dtype=np.float32)
    for c in range(3):
        cols[f"f_dc_{c}"] = p.features_dc[:, 0, c].numpy()
    k = p.features_rest.shape[1]
    for c in range(3):
        for j in range(k):
            cols[f"f_rest_{c * k + j}"] = p.features_rest[:, j, c].numpy()
    cols["opacity"] = p.opacity_logits.numpy()
    for i in range(3):
        cols[f"scale_{i}"] = p.log_scales[:, i].numpy()
    for i in range(4):
        cols[f"rot_{i}"] = p.rotations_raw[:, i].numpy()
    return cols


def make_ply(
    cols: dict[str, np.ndarray],
    fmt: str = "binary_little_endian",
    types: dict[str, str] | None = None,
    extra: str = "",
) -> bytes:
    """An independent PLY writer: header text plus rows packed with numpy (or text)."""
    types = types or {}
    names = list(cols)
    n = len(cols[names[0]])
    header = [f"ply\nformat {fmt} 1.0\ncomment written by the test\nelement vertex {n}\n"]
    header += [f"property {types.get(name, 'float')} {name}\n" for name in names]
    header.append(extra + "end_header\n")
    head = "".join(header).encode("ascii")
    if fmt == "ascii":
        lines = [" ".join(repr(cols[name][i].item()) for name in names) for i in range(n)]
        return head + "".join(line + "\n" for line in lines).encode("ascii")
    order = "<" if fmt == "binary_little_endian" else ">"
    dtype = np.dtype([(name, order + PLY_TYPES[types.get(name, "float")]) for name in names])
    rows = np.empty(n, dtype=dtype)
    for name in names:
        rows[name] = cols[name]
    return head + rows.tobytes()


def three_dgs_capture(p: GaussianParams, gen: torch.Generator) -> tuple:
    """What 3DGS's GaussianModel.capture() returns, with a real Adam state after a step."""
    params = {
        name: torch.nn.Parameter(t.clone())
        for name, t in (
            ("xyz", p.means),
            ("f_dc", p.features_dc),
            ("f_rest", p.features_rest),
            ("opacity", p.opacity_logits[:, None]),
            ("scaling", p.log_scales),
            ("rotation", p.rotations_raw),
        )
    }
    opt = torch.optim.Adam(
        [{"params": [t], "lr": 1e-3, "name": k} for k, t in params.items()], lr=0.0, eps=1e-15
    )
    sum(t.square().sum() for t in params.values()).backward()
    opt.step()
    n = p.num_gaussians
    return (
        p.sh_degree,
        params["xyz"],
        params["f_dc"],
        params["f_rest"],
        params["scaling"],
        params["rotation"],
        params["opacity"],
        torch.rand(n, generator=gen),
        torch.rand(n, 1, generator=gen),
        torch.ones(n, 1),
        opt.state_dict(),
        4.5,
    )
