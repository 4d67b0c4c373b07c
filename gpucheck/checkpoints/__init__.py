"""3DGS checkpoint I/O: PLY and ``.pt`` files holding raw parameters (``GaussianParams``).

``load(path)`` / ``save(params, path)`` pick the format from the suffix (``.ply``, ``.pt``,
``.pth``). Raw → activated conversions live in :mod:`gpucheck.checkpoints.activations` only.
Every problem with a file is a :class:`gpucheck.errors.CheckpointError` whose message names
the file and the problem.

The names are imported on first use: ``gpucheck lint-checkpoint`` reads PLYs with numpy only
and never pays for importing torch.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucheck.errors import CheckpointError

if TYPE_CHECKING:
    from gpucheck.checkpoints.model import ActivatedGaussians, GaussianParams
    from gpucheck.checkpoints.ply import read_ply, write_ply
    from gpucheck.checkpoints.pt import PtCheckpoint, read_pt, write_pt
    from gpucheck.checkpoints.roundtrip import RoundtripError, RoundtripReport, check_roundtrip

_LAZY = {
    "ActivatedGaussians": "model",
    "GaussianParams": "model",
    "read_ply": "ply",
    "write_ply": "ply",
    "PtCheckpoint": "pt",
    "read_pt": "pt",
    "write_pt": "pt",
    "RoundtripError": "roundtrip",
    "RoundtripReport": "roundtrip",
    "check_roundtrip": "roundtrip",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ActivatedGaussians",
    "CheckpointError",
    "GaussianParams",
    "PtCheckpoint",
    "RoundtripError",
    "RoundtripReport",
    "check_roundtrip",
    "load",
    "read_ply",
    "read_pt",
    "save",
    "write_ply",
    "write_pt",
]

_PT_SUFFIXES = (".pt", ".pth")


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix != ".ply" and suffix not in _PT_SUFFIXES:
        raise CheckpointError(
            f"{path}: unknown checkpoint suffix {suffix!r} (expected .ply, .pt or .pth)"
        )
    return suffix


def load(path: str | Path) -> GaussianParams:
    """Read the raw parameters of a ``.ply`` or ``.pt``/``.pth`` checkpoint (either .pt form).

    Raises:
        CheckpointError: unknown suffix, missing file, or any problem with its content.
    """
    path = Path(path)
    suffix = _suffix(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    from gpucheck.checkpoints.ply import read_ply
    from gpucheck.checkpoints.pt import read_pt

    return read_ply(path) if suffix == ".ply" else read_pt(path).params


def save(params: GaussianParams, path: str | Path) -> None:
    """Write ``params`` as PLY (``.ply``) or as the dict form of ``.pt`` (``.pt``/``.pth``).

    Raises:
        CheckpointError: unknown suffix, invalid ``params`` or an unwritable path.
    """
    from gpucheck.checkpoints.ply import write_ply
    from gpucheck.checkpoints.pt import write_pt

    path = Path(path)
    if _suffix(path) == ".ply":
        write_ply(params, path)
    else:
        write_pt(params, path)
