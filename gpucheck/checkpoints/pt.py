"""3DGS ``.pt`` checkpoints: a dict of raw tensors, or ``train.py``'s ``(capture, iteration)``.

* Dict form: ``{"means", "features_dc", "features_rest", "log_scales", "opacity_logits",
  "rotations_raw", "sh_degree"}`` (what :func:`write_pt` writes). The reader also accepts
  3DGS's attribute names ``_xyz _features_dc _features_rest _scaling _opacity _rotation``
  (with an optional ``active_sh_degree``; without one, the degree ``features_rest`` holds).
* Capture form: ``torch.save((gaussians.capture(), iteration), path)`` where ``capture()`` is
  ``(active_sh_degree, _xyz, _features_dc, _features_rest, _scaling, _rotation, _opacity,
  max_radii2D, xyz_gradient_accum, denom, optimizer_state_dict, spatial_lr_scale)``.

Files are loaded with ``torch.load(weights_only=True)``: both forms hold only tensors,
numbers, strings and containers (the Adam state dict included), so no pickled code ever runs.
A file that needs more is refused with a :class:`gpucheck.errors.CheckpointError`.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from gpucheck.checkpoints.model import GaussianParams, sh_degree_of
from gpucheck.errors import CheckpointError

__all__ = ["CAPTURE_FIELDS", "PtCheckpoint", "read_pt", "write_pt"]

CAPTURE_FIELDS = (
    "active_sh_degree",
    "_xyz",
    "_features_dc",
    "_features_rest",
    "_scaling",
    "_rotation",
    "_opacity",
    "max_radii2D",
    "xyz_gradient_accum",
    "denom",
    "optimizer_state_dict",
    "spatial_lr_scale",
)
#: GaussianParams field -> the attribute name of the 3DGS reference code (its GaussianModel).
ATTRIBUTE_NAMES = {
    "means": "_xyz",
    "features_dc": "_features_dc",
    "features_rest": "_features_rest",
    "log_scales": "_scaling",
    "opacity_logits": "_opacity",
    "rotations_raw": "_rotation",
}
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's default format since PyTorch 1.6
_PICKLE_PROTO = b"\x80"  # the legacy format starts with a pickle PROTO opcode
#: capture() items that are training state, not parameters.
_TRAINING_STATE = CAPTURE_FIELDS[7:]


@dataclass
class PtCheckpoint:
    """A ``.pt`` checkpoint as read: the parameters and, for the capture form, the rest."""

    params: GaussianParams
    form: Literal["dict", "capture"]
    iteration: int | None = None
    #: capture form: max_radii2D, xyz_gradient_accum, denom, optimizer_state_dict,
    #: spatial_lr_scale, as stored.
    training_state: dict[str, Any] = field(default_factory=dict)


def _load(path: Path) -> Any:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: no such file") from e
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror or e}") from e
    if magic != _ZIP_MAGIC and magic[:1] != _PICKLE_PROTO:
        raise CheckpointError(
            f"{path}: not a torch.save file (neither a zip archive nor a "
            f"pickle; starts with {magic!r})"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path}: refused: the file needs Python objects beyond tensors and containers "
            f"(loaded with weights_only=True so no pickled code runs): {first}"
        ) from e
    except Exception as e:  # torch reports a corrupt or truncated zip in many ways
        raise CheckpointError(
            f"{path}: not a readable torch.save file (corrupt or "
            f"truncated?): {type(e).__name__}: {e}"
        ) from e


def _params(
    tensors: dict[str, Any], degree: Any, source: str, finite: bool = True
) -> GaussianParams:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{source}: {name} must be a tensor, got {type(t).__name__}")
    opacity = tensors["opacity_logits"]
    if opacity.dim() == 2 and opacity.shape[1] == 1:  # 3DGS keeps [N, 1]
        opacity = opacity[:, 0]
    rest = tensors["features_rest"]
    if degree is None:
        degree = sh_degree_of(int(rest.shape[1])) if rest.dim() == 3 else 0
    return GaussianParams(
        means=tensors["means"].detach(),
        features_dc=tensors["features_dc"].detach(),
        features_rest=rest.detach(),
        log_scales=tensors["log_scales"].detach(),
        opacity_logits=opacity.detach(),
        rotations_raw=tensors["rotations_raw"].detach(),
        sh_degree=degree,
    ).validate(source, finite=finite)


def _from_dict(obj: dict[Any, Any], source: str, finite: bool = True) -> GaussianParams:
    ours = [k for k in ATTRIBUTE_NAMES if k in obj]
    theirs = [v for v in ATTRIBUTE_NAMES.values() if v in obj]
    if len(theirs) > len(ours):
        missing = [v for v in ATTRIBUTE_NAMES.values() if v not in obj]
        tensors = {k: obj.get(v) for k, v in ATTRIBUTE_NAMES.items()}
        degree = obj.get("active_sh_degree")
    else:
        missing = [k for k in (*ATTRIBUTE_NAMES, "sh_degree") if k not in obj]
        tensors = {k: obj.get(k) for k in ATTRIBUTE_NAMES}
        degree = obj.get("sh_degree")
    if missing:
        keys = ", ".join(map(str, list(obj)[:20]))
        raise CheckpointError(f"{source}: missing keys {', '.join(missing)} (has: {keys})")
    return _params(tensors, degree, source, finite)


def read_pt(path: str | Path, *, finite: bool = True) -> PtCheckpoint:
    """Read a ``.pt`` checkpoint in either form (detected from its content).

    ``finite=False`` keeps NaN/inf values (the lint counts them) instead of refusing them.

    Raises:
        CheckpointError: unreadable/corrupt file, a file that needs arbitrary pickled objects,
            an unknown layout, missing keys, non-tensors, wrong shapes or NaN/inf values.
    """
    path = Path(path)
    obj = _load(path)
    source = str(path)
    if isinstance(obj, dict):
        return PtCheckpoint(_from_dict(obj, source, finite), "dict")
    if isinstance(obj, tuple | list) and len(obj) == 2 and isinstance(obj[0], tuple | list):
        capture, iteration = obj
        if len(capture) != len(CAPTURE_FIELDS):
            raise CheckpointError(
                f"{source}: a 3DGS capture tuple has {len(CAPTURE_FIELDS)} items "
                f"({', '.join(CAPTURE_FIELDS)}), this one has {len(capture)}"
            )
        if isinstance(iteration, bool) or not isinstance(iteration, int):
            raise CheckpointError(f"{source}: iteration must be an int, got {iteration!r}")
        items = dict(zip(CAPTURE_FIELDS, capture, strict=True))
        degree = items["active_sh_degree"]
        if isinstance(degree, bool) or not isinstance(degree, int):
            raise CheckpointError(f"{source}: active_sh_degree must be an int, got {degree!r}")
        tensors = {k: items[v] for k, v in ATTRIBUTE_NAMES.items()}
        return PtCheckpoint(
            _params(tensors, degree, source, finite),
            "capture",
            iteration,
            {k: items[k] for k in _TRAINING_STATE},
        )
    raise CheckpointError(
        f"{source}: unknown .pt layout: expected a dict of tensors or 3DGS's "
        f"(capture_tuple, iteration), got {type(obj).__name__}"
    )


def write_pt(
    params: GaussianParams,
    path: str | Path,
    *,
    form: Literal["dict", "capture"] = "dict",
    iteration: int = 0,
    training_state: dict[str, Any] | None = None,
) -> None:
    """Write ``params`` as a ``.pt`` checkpoint.

    Args:
        params: the raw parameters.
        path: destination.
        form: ``"dict"`` (our field names and ``sh_degree``) or ``"capture"`` (3DGS's
            ``(capture_tuple, iteration)``; opacity stored as ``[N, 1]``).
        iteration: the capture form's iteration.
        training_state: the capture form's non-parameter items (``PtCheckpoint
            .training_state``). Without it, gradient statistics are zeros, the optimizer
            state is ``{}`` and ``spatial_lr_scale`` is 1.0: fine for reading the parameters
            back, but 3DGS's ``restore`` needs a real optimizer state to resume training.

    Raises:
        CheckpointError: invalid ``params``, an unknown ``form`` or an unwritable path.
    """
    path = Path(path)
    params.validate(f"{path}: refusing to write")
    tensors = {k: v.detach().cpu() for k, v in params.tensors().items()}
    obj: Any
    if form == "dict":
        obj = {**tensors, "sh_degree": params.sh_degree}
    elif form == "capture":
        n = params.num_gaussians
        state = {
            "max_radii2D": torch.zeros(n),
            "xyz_gradient_accum": torch.zeros(n, 1),
            "denom": torch.zeros(n, 1),
            "optimizer_state_dict": {},
            "spatial_lr_scale": 1.0,
            **(training_state or {}),
        }
        items: dict[str, Any] = {v: tensors[k] for k, v in ATTRIBUTE_NAMES.items()}
        items["_opacity"] = items["_opacity"].reshape(n, 1)
        items["active_sh_degree"] = params.sh_degree
        capture = tuple(items[f] if f in items else state[f] for f in CAPTURE_FIELDS)
        obj = (capture, iteration)
    else:
        raise CheckpointError(f"{path}: form must be 'dict' or 'capture', got {form!r}")
    try:
        torch.save(obj, path)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot write: {e.strerror or e}") from e
