"""The layout of 3DGS PLY files and SH degrees, without torch (the lint reads PLYs with numpy
only, so ``gpucheck lint-checkpoint`` starts fast)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from plyfile import PlyData, PlyElement, PlyElementParseError, PlyHeaderParseError

from gpucheck.errors import CheckpointError

__all__ = ["MAX_SH_DEGREE", "SCALAR_FIELDS", "parse", "sh_degree_of", "vertex_layout"]

MAX_SH_DEGREE = 3
SCALAR_FIELDS = [
    "x",
    "y",
    "z",
    "f_dc_0",
    "f_dc_1",
    "f_dc_2",
    "opacity",
    "scale_0",
    "scale_1",
    "scale_2",
    "rot_0",
    "rot_1",
    "rot_2",
    "rot_3",
]
_F_REST = re.compile(r"f_rest_(\d+)")
_SCALAR_FIELDS = SCALAR_FIELDS


def sh_degree_of(rest_coeffs: int) -> int | None:
    """The SH degree ``d`` with ``(d + 1)^2 - 1 == rest_coeffs`` (``d <= 3``), else None."""
    d = math.isqrt(rest_coeffs + 1) - 1
    return d if (d + 1) ** 2 - 1 == rest_coeffs and d <= MAX_SH_DEGREE else None


def parse(path: Path) -> PlyData:
    try:
        with open(path, "rb") as f:
            if f.read(4)[:3] != b"ply":
                raise CheckpointError(f"{path}: not a PLY file (it does not start with 'ply')")
            f.seek(0)
            return PlyData.read(f)
    except CheckpointError:
        raise
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror or e}") from e
    except PlyHeaderParseError as e:
        raise CheckpointError(f"{path}: malformed PLY header: {e}") from e
    except PlyElementParseError as e:
        name = e.element.name if e.element is not None else "?"
        count = e.element.count if e.element is not None else "?"
        if e.message == "early end-of-file":
            raise CheckpointError(
                f"{path}: truncated: the header promises {count} '{name}' rows, the file "
                f"ends after {e.row} complete row(s)"
            ) from e
        raise CheckpointError(f"{path}: corrupt PLY data in element '{name}': {e}") from e
    except UnicodeDecodeError as e:
        raise CheckpointError(
            f"{path}: corrupt PLY: byte {e.object[e.start : e.end]!r} where "
            f"ASCII text belongs (header or ASCII data)"
        ) from e
    except Exception as e:  # plyfile/numpy fail in many ways on garbage (fuzz-tested)
        raise CheckpointError(f"{path}: cannot parse PLY ({type(e).__name__}: {e})") from e


def vertex_layout(ply: PlyData, path: Path) -> tuple[PlyElement, int]:
    """The ``vertex`` element of a parsed 3DGS PLY and its ``f_rest`` count.

    Raises:
        CheckpointError: no ``vertex`` element, missing properties (all listed), ``f_rest``
            numbered with gaps or a count that is not ``3 * ((d + 1)^2 - 1)`` for ``d <= 3``.
    """
    names = [e.name for e in ply.elements]
    if "vertex" not in names:
        raise CheckpointError(f"{path}: no 'vertex' element (elements: {names or 'none'})")
    vertex = ply["vertex"]
    props = [p.name for p in vertex.properties]
    missing = [f for f in _SCALAR_FIELDS if f not in props]
    if missing:
        raise CheckpointError(f"{path}: missing vertex properties: {' '.join(missing)}")
    rest_ids = sorted(int(m.group(1)) for p in props if (m := _F_REST.fullmatch(p)))
    count = len(rest_ids)
    if rest_ids != list(range(count)):
        gaps = sorted(set(range(max(rest_ids, default=-1) + 1)) - set(rest_ids))
        raise CheckpointError(
            f"{path}: f_rest properties are not numbered 0..{count - 1} "
            f"(missing: {' '.join(f'f_rest_{i}' for i in gaps)})"
        )
    if count % 3 or sh_degree_of(count // 3) is None:
        raise CheckpointError(
            f"{path}: {count} f_rest properties; expected 3 * ((d + 1)^2 - 1) for an SH "
            f"degree d in 0..3 (0, 9, 24 or 45)"
        )
    return vertex, count
