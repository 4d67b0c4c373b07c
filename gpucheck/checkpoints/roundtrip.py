"""``check_roundtrip(save_fn, load_fn)``: your own checkpoint code, checked the way 3DGS needs it.

``load_fn(save_fn(x))`` must give back the raw parameters ``x`` exactly, and render the same
image. When a field comes back as its activation (``exp`` of the log-scales, ``sigmoid`` of the
logits, normalized quaternions), the save or the load applied it, and the renderer will apply it
again: that is the double activation of failure 3 in ``docs/failures.md``, named as such with
the numbers. Each call is also kept for the harness: in a ``gpucheck run``, a failed round trip
becomes a ``double-activation`` (or ``checkpoint-roundtrip``) finding of the case
(:mod:`gpucheck.checkpoints.detectors.double_activation`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpucheck.checkpoints.activations import (
    inverse_opacity_activation,
    inverse_scale_activation,
    opacity_activation,
    rotation_activation,
    scale_activation,
)
from gpucheck.checkpoints.model import GaussianParams

__all__ = ["OUTCOMES", "RoundtripError", "RoundtripReport", "check_roundtrip", "sample_params"]

#: round trips checked in this process since the harness last looked (the worker's detector
#: empties it around every case)
OUTCOMES: list[RoundtripReport] = []
_ACTIVATIONS: dict[str, tuple[tuple[str, Callable[[torch.Tensor], torch.Tensor]], ...]] = {
    "log_scales": (
        ("exp", scale_activation),
        ("log", inverse_scale_activation),
        ("exp applied twice", lambda t: scale_activation(scale_activation(t))),
    ),
    "opacity_logits": (("sigmoid", opacity_activation), ("logit", inverse_opacity_activation)),
    "rotations_raw": (("normalize", rotation_activation),),
}
_3DGS = {
    "means": "_xyz",
    "features_dc": "_features_dc",
    "features_rest": "_features_rest",
    "log_scales": "_scaling",
    "opacity_logits": "_opacity",
    "rotations_raw": "_rotation",
}


@dataclass
class RoundtripReport:
    """What came back, field by field, and whether it renders the same."""

    ok: bool
    fields: dict[str, str] = field(default_factory=dict)  #: field -> "same" or what differs
    activated: list[str] = field(default_factory=list)  #: fields that came back activated
    render: str | None = None  #: image comparison, in words
    message: str = ""


class RoundtripError(AssertionError):
    """``load_fn(save_fn(x))`` is not ``x``; ``.report`` has the details."""

    def __init__(self, report: RoundtripReport) -> None:
        super().__init__(report.message)
        self.report = report


def sample_params(n: int = 256, sh_degree: int = 1, seed: int = 0) -> GaussianParams:
    """A small trained-like raw scene: log-scales around -3, logits spread over [-5, 5],
    quaternions far from unit norm (so a normalization shows), in front of a camera at the
    origin looking along +z."""
    g = torch.Generator().manual_seed(seed)
    k = (sh_degree + 1) ** 2 - 1
    means = torch.randn(n, 3, generator=g) * torch.tensor([0.8, 0.6, 0.5]) + torch.tensor(
        [0.0, 0.0, 4.0]
    )
    return GaussianParams(
        means=means,
        features_dc=torch.randn(n, 1, 3, generator=g),
        features_rest=torch.randn(n, k, 3, generator=g) * 0.2,
        log_scales=torch.randn(n, 3, generator=g) * 0.4 - 3.0,
        opacity_logits=torch.randn(n, generator=g) * 2.5,
        rotations_raw=torch.randn(n, 4, generator=g) * 0.5 + torch.tensor([1.5, 0, 0, 0]),
        sh_degree=sh_degree,
    )


def _as_params(loaded: Any, like: GaussianParams) -> dict[str, torch.Tensor]:
    """The raw tensors of what ``load_fn`` returned: GaussianParams, a mapping (our names or
    3DGS's), or an object with 3DGS's attributes (``GaussianModel``)."""
    if isinstance(loaded, GaussianParams):
        return loaded.tensors()
    out = {}
    for name, theirs in _3DGS.items():
        if isinstance(loaded, Mapping):
            value = loaded.get(name, loaded.get(theirs))
        else:
            value = getattr(loaded, name, getattr(loaded, theirs, None))
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"check_roundtrip: load_fn returned {type(loaded).__name__} "
                f"without a tensor {name!r} (or {theirs!r})"
            )
        out[name] = value.detach().cpu().to(like.tensors()[name].dtype)
    out["opacity_logits"] = out["opacity_logits"].reshape(-1)
    return out


def _compare(
    name: str, want: torch.Tensor, got: torch.Tensor, rtol: float, atol: float
) -> tuple[str, str | None]:
    """("same" or what differs, the activation it matches or None)."""
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, saved {list(want.shape)}", None
    if torch.allclose(got, want, rtol=rtol, atol=atol):
        return "same", None
    err = float((got - want).abs().max())
    for what, fn in _ACTIVATIONS.get(name, ()):
        if torch.allclose(got, fn(want), rtol=1e-4, atol=1e-6):
            return f"came back as {what}(saved) (max |loaded - saved| {err:.3g})", what
    return f"differs: max |loaded - saved| {err:.3g}", None


def _render(p: dict[str, torch.Tensor], degree: int, size: int) -> tuple[torch.Tensor, int]:
    from gpucheck.reference import rasterize

    viewmat = torch.eye(4, dtype=torch.float64)
    K = torch.tensor([[size, 0, size / 2], [0, size, size / 2], [0, 0, 1]], dtype=torch.float64)
    sh = torch.cat([p["features_dc"], p["features_rest"]], dim=1).double()
    out = rasterize(
        p["means"].double(),
        scale_activation(p["log_scales"].double()),
        rotation_activation(p["rotations_raw"].double()),
        opacity_activation(p["opacity_logits"].double()),
        sh=sh,
        sh_degree=degree,
        viewmat=viewmat,
        K=K,
        width=size,
        height=size,
    )
    return out.image, out.n_intersections


def check_roundtrip(
    save_fn: Callable[[GaussianParams, Path], Any],
    load_fn: Callable[[Path], Any],
    params: GaussianParams | None = None,
    *,
    suffix: str = ".ply",
    rtol: float = 1e-6,
    atol: float = 1e-7,
    render_size: int | None = 48,
) -> RoundtripReport:
    """Save ``params`` with ``save_fn``, load them back with ``load_fn``, compare.

    Args:
        save_fn: ``save_fn(params, path)`` writes raw :class:`GaussianParams` to ``path``.
        load_fn: ``load_fn(path)`` returns the raw parameters: :class:`GaussianParams`, a
            mapping or an object with our field names or 3DGS's (``_xyz``, ``_scaling``,
            ``_opacity``, ``_rotation``, ``_features_dc``, ``_features_rest``).
        params: the scene to save (default: :func:`sample_params`).
        suffix: of the temporary file the functions get.
        rtol, atol: per-field tolerance of the comparison.
        render_size: render both with the reference rasterizer at this size (pixels, square;
            None: skip) and compare the images and the tile overlaps.

    Returns:
        The report (``ok``).

    Raises:
        RoundtripError: (an AssertionError) a field came back different, or the render
            differs; the message names each field, the activation it came back as, and
            "activation applied twice" when that is what rendering would do.
    """
    params = params or sample_params()
    saved = params.tensors()
    with tempfile.TemporaryDirectory(prefix="gpucheck-roundtrip-") as tmp:
        path = Path(tmp) / f"checkpoint{suffix}"
        save_fn(params, path)
        got = _as_params(load_fn(path), params)
    report = RoundtripReport(ok=True)
    for name, want in saved.items():
        said, act = _compare(name, want.detach().cpu(), got[name], rtol, atol)
        report.fields[name] = said
        if said != "same":
            report.ok = False
        if act in ("exp", "sigmoid", "normalize", "exp applied twice"):
            report.activated.append(name)
    if render_size:
        image_a, n_a = _render(
            {k: v.detach().cpu() for k, v in saved.items()}, params.sh_degree, render_size
        )
        try:
            image_b, n_b = _render(got, params.sh_degree, render_size)
            diff = float((image_a - image_b).abs().max())
            report.render = (
                f"{render_size}x{render_size} render: max |difference| {diff:.3g}; "
                f"Gaussian-tile overlaps {n_b:,} after the round trip, {n_a:,} "
                f"before"
            )
            if diff > 1e-5 or n_a != n_b:
                report.ok = False
        except Exception as err:  # a loaded scene the rasterizer refuses (NaN, zero quats)
            report.render = f"the loaded scene does not render: {type(err).__name__}: {err}"
            report.ok = False
    report.message = _message(report)
    OUTCOMES.append(report)
    if not report.ok:
        raise RoundtripError(report)
    return report


def _message(r: RoundtripReport) -> str:
    if r.ok:
        return "checkpoint round trip: every field and the render came back the same"
    parts = [f"{k}: {v}" for k, v in r.fields.items() if v != "same"]
    head = "checkpoint round trip failed"
    if r.activated:
        bad = ", ".join(r.activated)
        head = (
            f"activation applied twice: {bad} came back activated from save/load, and "
            f"rendering activates them again"
        )
    return "; ".join([head, *parts, *([r.render] if r.render else [])])
