"""3DGS checkpoint I/O: PLY and ``.pt`` files holding raw parameters (``GaussianParams``).

``load(path)`` / ``save(params, path)`` pick the format from the suffix (``.ply``, ``.pt``,
``.pth``). Raw → activated conversions live in :mod:`gpucheck.checkpoints.activations` only.
Every problem with a file is a :class:`gpucheck.errors.CheckpointError` whose message names
the file and the problem.
"""

from __future__ import annotations

from pathlib import Path

from gpucheck.checkpoints.model import ActivatedGaussians, GaussianParams
from gpucheck.checkpoints.ply import read_ply, write_ply
from gpucheck.checkpoints.pt import PtCheckpoint, read_pt, write_pt
from gpucheck.checkpoints.roundtrip import RoundtripError, RoundtripReport, check_roundtrip
from gpucheck.errors import CheckpointError

__all__ = ["ActivatedGaussians", "CheckpointError", "GaussianParams", "PtCheckpoint",
           "RoundtripError", "RoundtripReport", "check_roundtrip", "load", "read_ply", "read_pt",
           "save", "write_ply", "write_pt"]

_PT_SUFFIXES = (".pt", ".pth")


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix != ".ply" and suffix not in _PT_SUFFIXES:
        raise CheckpointError(f"{path}: unknown checkpoint suffix {suffix!r} "
                              f"(expected .ply, .pt or .pth)")
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
    return read_ply(path) if suffix == ".ply" else read_pt(path).params


def save(params: GaussianParams, path: str | Path) -> None:
    """Write ``params`` as PLY (``.ply``) or as the dict form of ``.pt`` (``.pt``/``.pth``).

    Raises:
        CheckpointError: unknown suffix, invalid ``params`` or an unwritable path.
    """
    path = Path(path)
    if _suffix(path) == ".ply":
        write_ply(params, path)
    else:
        write_pt(params, path)
