"""``gpucheck lint-checkpoint``: is a 3DGS checkpoint raw, as 3DGS stores it, or already activated?

3DGS stores log-scales (activation ``exp``), opacity logits (``sigmoid``) and raw quaternions
(normalize). A checkpoint saved *after* the activations and loaded with 3DGS conventions is
activated twice: ``exp(exp(log_s))`` makes every Gaussian cover every screen tile, and the next
render asks for tens of GiB (``docs/failures.md``, failure 3). The lint reads the stored values
only, never activates anything on a GPU, and says per parameter what it saw:

* scales: the share of stored values above 0 (log-scales of a trained scene are mostly
  negative), their distribution, and the world sizes they imply once ``exp`` is applied, against
  the scene's extent (the diagonal of the 2nd..98th percentile box of the means);
* opacities: the share inside [0, 1] (all of them: sigmoid was applied already);
* rotations: quaternion norms (all 1: normalized already; harmless, normalizing twice changes
  nothing, but it tells how the file was written) and zero quaternions;
* NaN and inf in every field, and stored values whose ``exp`` overflows float32.

Each parameter gets a verdict ``ok``, ``suspicious`` or ``activated``; the file's verdict is
``activated`` when scales or opacities are, ``suspicious`` when any parameter is, else ``ok``.
PLYs are read through a memory map, a block of rows at a time, so a 3M-Gaussian SH-3 file
(~700 MB) takes seconds and little memory (benchmarks/lint_checkpoint.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpucheck.checkpoints.layout import sh_degree_of
from gpucheck.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, CheckpointError

__all__ = ["VERDICTS", "LintReport", "ParamLint", "lint", "lint_arrays"]

VERDICTS = ("ok", "suspicious", "activated")
#: float32 ``exp`` overflows above this
EXP_OVERFLOW = math.log(np.finfo(np.float32).max)
#: rows per block when scanning a memory-mapped PLY
BLOCK_ROWS = 1 << 16
#: a quaternion norm within this of 1 counts as normalized
UNIT_TOL = 1e-3


@dataclass
class ParamLint:
    """What the lint saw in one parameter, and its verdict."""

    name: str  #: scales, opacities, rotations, means, features
    verdict: str  #: ok, suspicious, activated
    says: str  #: the evidence in one line of words
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class LintReport:
    """The lint of one checkpoint file."""

    path: str
    verdict: str  #: ok, suspicious, activated, or unreadable
    layout: str | None = None  #: e.g. "PLY binary_little_endian", ".pt capture form"
    n: int | None = None
    sh_degree: int | None = None
    params: list[ParamLint] = field(default_factory=list)
    fix: str | None = None
    error: str | None = None  #: why the file is unreadable
    render: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        if self.verdict == "unreadable":
            return EXIT_USAGE
        return EXIT_CLEAN if self.verdict == "ok" else EXIT_FINDINGS

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Arrays:
    """The stored (raw, as the file holds them) values the lint judges, float32."""

    means: np.ndarray  # [N, 3]
    scales: np.ndarray  # [N, 3] as stored (log-scales if raw)
    opacities: np.ndarray  # [N] as stored (logits if raw)
    rotations: np.ndarray  # [N, 4] as stored
    bad: dict[str, int]  # field group -> NaN/inf count (features included)


def _pct(x: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    if x.size == 0:
        return [float("nan")] * len(qs)
    return [float(v) for v in np.percentile(x, qs)]


def _g(x: float) -> str:
    return f"{x:.3g}"


def extent_of(means: np.ndarray) -> float:
    """The diagonal of the box spanned by the 2nd..98th percentile of the finite means."""
    ok = means[np.isfinite(means).all(axis=1)]
    if len(ok) < 2:
        return 0.0
    lo, hi = np.percentile(ok, [2, 98], axis=0)
    return float(np.linalg.norm(hi - lo))


def _scales(s: np.ndarray, extent: float, bad: int) -> ParamLint:
    fin = s[np.isfinite(s).all(axis=1)]
    n = len(s)
    biggest = fin.max(axis=1) if len(fin) else fin.reshape(0)
    positive = float((fin > 0).mean()) if fin.size else 0.0
    p1, p50, p99 = _pct(biggest, (1, 50, 99))
    overflow = int((fin > EXP_OVERFLOW).any(axis=1).sum())
    implied = [math.exp(min(v, 700.0)) for v in (p1, p50, p99)]  # exp is monotonic
    ev = {
        "n": n,
        "nonfinite": bad,
        "share_positive": positive,
        "stored_largest_axis_p1_p50_p99": [p1, p50, p99],
        "stored_min": float(fin.min()) if fin.size else None,
        "stored_max": float(fin.max()) if fin.size else None,
        "implied_size_p1_p50_p99": implied,
        "exp_overflow": overflow,
        "scene_extent": extent,
    }
    words = (
        f"{positive:.1%} of stored values > 0; largest axis stored p1/p50/p99 "
        f"{_g(p1)}/{_g(p50)}/{_g(p99)}; with exp (3DGS load) world sizes p50 "
        f"{_g(implied[1])}, p99 {_g(implied[2])} vs scene extent {_g(extent)}"
    )
    if bad:
        return ParamLint("scales", "suspicious", f"{bad} NaN/inf values; " + words, ev)
    if overflow:
        return ParamLint(
            "scales",
            "suspicious",
            f"{overflow} Gaussians overflow to inf with exp (stored > 88.7); " + words,
            ev,
        )
    if not fin.size:
        return ParamLint("scales", "ok", "no Gaussians", ev)
    plausible_sizes = extent <= 0 or p99 <= extent
    huge_as_raw = extent > 0 and implied[1] >= 0.01 * extent
    if positive >= 0.99 and plausible_sizes and (huge_as_raw or extent <= 0):
        return ParamLint(
            "scales",
            "activated",
            "already exponentiated: all positive and plausible as world sizes, "
            "while as log-scales every Gaussian would be at least 1 unit "
            f"(median {implied[1] / extent:.1%} of the scene); " + words
            if extent > 0
            else "already exponentiated: all positive; " + words,
            ev,
        )
    if positive >= 0.5 or (extent > 0 and implied[1] >= 0.05 * extent):
        return ParamLint(
            "scales",
            "suspicious",
            "mostly positive or large once "
            "exponentiated (trained log-scales are mostly negative); " + words,
            ev,
        )
    return ParamLint("scales", "ok", "log-scales: " + words, ev)


def _opacities(o: np.ndarray, bad: int) -> ParamLint:
    fin = o[np.isfinite(o)]
    inside = float(((fin >= 0) & (fin <= 1)).mean()) if fin.size else 0.0
    lo, p50, hi = (
        (float(fin.min()), float(np.median(fin)), float(fin.max())) if fin.size else (math.nan,) * 3
    )
    ev = {
        "n": len(o),
        "nonfinite": bad,
        "share_inside_0_1": inside,
        "min": lo,
        "p50": p50,
        "max": hi,
        "share_negative": float((fin < 0).mean()) if fin.size else 0.0,
    }
    words = f"{inside:.1%} inside [0, 1] (min {_g(lo)}, p50 {_g(p50)}, max {_g(hi)})"
    if bad:
        return ParamLint("opacities", "suspicious", f"{bad} NaN/inf values; " + words, ev)
    if not fin.size:
        return ParamLint("opacities", "ok", "no Gaussians", ev)
    if inside == 1.0 and hi > lo:
        return ParamLint(
            "opacities",
            "activated",
            "sigmoid already applied: " + words + " (trained logits spread well outside [0, 1])",
            ev,
        )
    if inside >= 0.95:
        return ParamLint("opacities", "suspicious", "nearly all inside [0, 1]: " + words, ev)
    return ParamLint("opacities", "ok", "logits: " + words, ev)


def _rotations(q: np.ndarray, bad: int) -> ParamLint:
    fin = q[np.isfinite(q).all(axis=1)]
    norms = np.sqrt(np.einsum("ij,ij->i", fin, fin))  # float32: far finer than UNIT_TOL
    zero = int((norms == 0).sum())
    unit = float((np.abs(norms - 1) <= UNIT_TOL).mean()) if len(norms) else 0.0
    identity = bool(len(fin)) and bool((fin[:, 0] == 1).all()) and not fin[:, 1:].any()
    p1, p50, p99 = _pct(norms, (1, 50, 99))
    ev = {
        "n": len(q),
        "nonfinite": bad,
        "zero_norm": zero,
        "share_unit_norm": unit,
        "norm_p1_p50_p99": [p1, p50, p99],
        "all_identity": identity,
    }
    words = f"norms p1/p50/p99 {_g(p1)}/{_g(p50)}/{_g(p99)}, {unit:.1%} within 1e-3 of 1"
    if bad or zero:
        what = "; ".join(
            x
            for x in (
                f"{bad} NaN/inf values" if bad else "",
                f"{zero} zero quaternions (cannot be normalized)" if zero else "",
            )
            if x
        )
        return ParamLint("rotations", "suspicious", f"{what}; {words}", ev)
    if identity:
        return ParamLint("rotations", "ok", "all (1, 0, 0, 0), as 3DGS initializes them", ev)
    if len(norms) and unit == 1.0:
        return ParamLint(
            "rotations",
            "activated",
            "normalized already: " + words + " (harmless alone: normalizing again changes nothing)",
            ev,
        )
    return ParamLint("rotations", "ok", "raw quaternions: " + words, ev)


def lint_arrays(a: _Arrays) -> tuple[list[ParamLint], str, str | None]:
    """Per-parameter verdicts, the file's verdict and the fix in words."""
    extent = extent_of(a.means)
    means = ParamLint(
        "means",
        "suspicious" if a.bad.get("means") else "ok",
        (f"{a.bad['means']} NaN/inf values; " if a.bad.get("means") else "")
        + f"scene extent {_g(extent)} (2nd..98th percentile box diagonal)",
        {"nonfinite": a.bad.get("means", 0), "scene_extent": extent},
    )
    feats = a.bad.get("features", 0)
    features = ParamLint(
        "features",
        "suspicious" if feats else "ok",
        f"{feats} NaN/inf values in f_dc/f_rest" if feats else "no NaN/inf in f_dc/f_rest",
        {"nonfinite": feats},
    )
    scales, opacities = (
        _scales(a.scales, extent, a.bad.get("scales", 0)),
        _opacities(a.opacities, a.bad.get("opacities", 0)),
    )
    if (
        scales.verdict == "suspicious"
        and opacities.verdict == "activated"
        and scales.evidence["share_positive"] >= 0.99
        and not scales.evidence["nonfinite"]
        and not scales.evidence["exp_overflow"]
    ):
        # all positive in a large scene: alone that could be a scene in small units, but
        # with the opacities activated too the file was written after the activations
        scales.verdict = "activated"
        scales.says = (
            "already exponentiated: all positive, and the opacities are activated "
            "too; " + scales.says.split("; ", 1)[1]
        )
    params = [
        scales,
        opacities,
        _rotations(a.rotations, a.bad.get("rotations", 0)),
        means,
        features,
    ]
    by = {p.name: p.verdict for p in params}
    activated = [n for n in ("scales", "opacities") if by[n] == "activated"]
    if activated:
        verdict = "activated"
    elif any(p.verdict == "suspicious" for p in params):
        verdict = "suspicious"
    else:
        verdict = "ok"
    return params, verdict, _fix(verdict, params)


_INVERSE = {
    "scales": "log(scales) (inverse_scale_activation)",
    "opacities": "logit(opacities) (inverse_opacity_activation)",
}


def _fix(verdict: str, params: list[ParamLint]) -> str | None:
    if verdict == "ok":
        return None
    if verdict == "activated":
        done = [p.name for p in params if p.verdict == "activated" and p.name in _INVERSE]
        how = ", ".join(_INVERSE[n] for n in done)
        return (
            f"{' and '.join(done)} in this file are already activated; a 3DGS loader "
            f"activates them again (exp(exp(log_s)): every Gaussian covers the screen, the "
            f"render asks for tens of GiB). Fix the writer to store raw values: {how} "
            f"(gpucheck.checkpoints.activations); to use this file as it is, convert it "
            f"once the same way, or load it without applying the activations."
        )
    bad = [p for p in params if p.verdict == "suspicious"]
    return (
        "check how this file was written: "
        + "; ".join(f"{p.name}: {p.says}" for p in bad)
        + ". Non-finite values must be found at their source (the optimizer step that "
        "produced them); positive log-scales need a scene in units where Gaussians "
        "are larger than 1."
    )


# --- reading -------------------------------------------------------------------------------

_GROUPS = {
    "x": "means",
    "y": "means",
    "z": "means",
    "opacity": "opacities",
    **{f"scale_{i}": "scales" for i in range(3)},
    **{f"rot_{i}": "rotations" for i in range(4)},
}


def _group(prop: str) -> str | None:
    if prop.startswith(("f_dc_", "f_rest_")):
        return "features"
    return _GROUPS.get(prop)


def _blocks(data: np.ndarray) -> Iterator[np.ndarray]:
    for start in range(0, len(data), BLOCK_ROWS):
        yield data[start : start + BLOCK_ROWS]


def _read_ply(path: Path) -> tuple[_Arrays, str, int, int]:
    from gpucheck.checkpoints.layout import parse, vertex_layout

    ply = parse(path)  # binary files are memory-mapped: nothing is read yet
    vertex, rest = vertex_layout(ply, path)
    data = vertex.data
    names = list(data.dtype.names or ())
    for name in names:
        if _group(name) and data.dtype[name].kind not in "fiu":
            raise CheckpointError(
                f"{path}: property {name} is not a numeric scalar ({data.dtype[name]})"
            )
    n = len(data)
    out = {
        k: np.empty((n, w), np.float32)
        for k, w in (("means", 3), ("scales", 3), ("opacities", 1), ("rotations", 4))
    }
    cols = {
        "means": ["x", "y", "z"],
        "scales": ["scale_0", "scale_1", "scale_2"],
        "opacities": ["opacity"],
        "rotations": ["rot_0", "rot_1", "rot_2", "rot_3"],
    }
    bad = dict.fromkeys(("means", "scales", "opacities", "rotations", "features"), 0)
    float_names = [nm for nm in names if _group(nm) and data.dtype[nm].kind == "f"]
    # one homogeneous view of the float properties: NaN/inf of every field in one pass
    same = (
        len({data.dtype[nm] for nm in names}) == 1
        and data.dtype.itemsize == len(names) * data.dtype[names[0]].itemsize
    )
    group_of = np.array([_group(nm) or "" for nm in names])
    start = 0
    for block in _blocks(data):
        m = len(block)
        if same and float_names:
            flat = np.ascontiguousarray(block).view(data.dtype[names[0]]).reshape(m, len(names))
            counts = (~np.isfinite(flat)).sum(axis=0)
            for g in bad:
                bad[g] += int(counts[group_of == g].sum())
        else:
            for nm in float_names:
                bad[str(_group(nm))] += int((~np.isfinite(block[nm])).sum())
        for key, fields in cols.items():
            for j, nm in enumerate(fields):
                out[key][start : start + m, j] = block[nm]
        start += m
    layout = (
        "PLY ascii"
        if ply.text
        else (f"PLY binary_{'big' if ply.byte_order == '>' else 'little'}_endian")
    )
    arrays = _Arrays(out["means"], out["scales"], out["opacities"][:, 0], out["rotations"], bad)
    return arrays, layout, n, sh_degree_of(rest // 3) or 0


def _read_pt(path: Path) -> tuple[_Arrays, str, int, int]:
    import torch

    from gpucheck.checkpoints.pt import read_pt

    ck = read_pt(path, finite=False)
    p = ck.params

    def arr(t: torch.Tensor) -> np.ndarray:
        return t.detach().to(torch.float32).cpu().numpy()

    def nonfinite(*ts: torch.Tensor) -> int:
        return sum(int((~torch.isfinite(t)).sum()) for t in ts)

    bad = {
        "means": nonfinite(p.means),
        "scales": nonfinite(p.log_scales),
        "opacities": nonfinite(p.opacity_logits),
        "rotations": nonfinite(p.rotations_raw),
        "features": nonfinite(p.features_dc, p.features_rest),
    }
    layout = (
        ".pt dict form"
        if ck.form == "dict"
        else (f".pt capture form (capture_tuple, iteration {ck.iteration})")
    )
    return (
        _Arrays(arr(p.means), arr(p.log_scales), arr(p.opacity_logits), arr(p.rotations_raw), bad),
        layout,
        p.num_gaussians,
        p.max_sh_degree,
    )


#: checkpoint format by file suffix (``fmt`` of :func:`lint` overrides it)
FORMATS = {".ply": "ply", ".pt": "pt", ".pth": "pt"}


def read_arrays(path: str | Path, fmt: str | None = None) -> tuple[_Arrays, str, int, int]:
    """The stored values of a checkpoint, its layout, N and SH degree (NaN/inf kept).

    ``fmt`` (``"ply"`` or ``"pt"``) reads the file in that format whatever its suffix.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    fmt = fmt or FORMATS.get(suffix)
    if fmt == "ply":
        return _read_ply(path)
    if fmt == "pt":
        return _read_pt(path)
    raise CheckpointError(
        f"{path}: unknown checkpoint suffix {suffix!r} (expected .ply, .pt or .pth)"
    )


def lint(
    path: str | Path, render: tuple[int, int] | None = None, *, fmt: str | None = None
) -> LintReport:
    """Lint one checkpoint file.

    Args:
        path: a ``.ply``, ``.pt`` or ``.pth`` file (either .pt form).
        render: ``(width, height)``: also estimate, for a camera that frames the scene, the
            Gaussian-tile overlaps and binning bytes of a render of the file loaded with 3DGS
            conventions and loaded correctly (:mod:`gpucheck.checkpoints.render_estimate`).
        fmt: ``"ply"`` or ``"pt"``: read the file in that format whatever its suffix (a file
            a case read with plyfile or ``torch.load``); default: the suffix tells.

    Returns:
        The report; an unreadable file gives verdict ``unreadable`` with the reason in
        ``error`` (never an exception).
    """
    try:
        arrays, layout, n, degree = read_arrays(path, fmt)
    except CheckpointError as err:
        return LintReport(str(path), "unreadable", error=str(err))
    params, verdict, fix = lint_arrays(arrays)
    report = LintReport(str(path), verdict, layout, n, degree, params, fix)
    if render is not None:
        from gpucheck.checkpoints.render_estimate import estimate

        scales_activated = params[0].verdict == "activated"
        report.render = estimate(
            arrays.means, arrays.scales, arrays.rotations, render, scales_activated
        )
    return report
