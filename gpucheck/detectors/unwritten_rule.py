"""Design or bug: whether an output's unwritten elements are the extension's convention.

The elements of an output that a call never wrote (:mod:`~gpucheck.detectors.unwritten_probe`
finds them) are the extension's convention when another output of the same call is an
integer or bool tensor (a count, a radius, a mask), itself written everywhere, that shares
the output's leading dimension(s) and is 0 (False) in every row (of those dimensions) holding
an unwritten element (:func:`marker`); or when its author declared the output
(``GPUCHECK_UNWRITTEN``: :func:`declared`). A convention found once is applied to every
later call of the op whose marker fits (:func:`left_out`: what a comparison of results
leaves out).
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from gpucheck.detectors.unwritten import UNWRITTEN_ENV, conventions, output_names


def declared(op: str, index: int, name: str | None, text: str | None = None) -> bool:
    """Whether ``GPUCHECK_UNWRITTEN`` (or ``text``) names this output of ``op`` as unwritten
    by design: ``op`` (all its outputs), ``op:INDEX`` or ``op:NAME``; a ``torch.ops`` op as
    ``namespace::name``, a pybind11 function as ``package._C.function``."""
    raw = os.environ.get(UNWRITTEN_ENV) if text is None else text
    for item in (x.strip() for x in (raw or "").split(",")):
        if "::" in item:
            ns, _, rest = item.partition("::")
            base, sep, which = rest.partition(":")
            base = f"{ns}::{base}"
        else:
            base, sep, which = item.partition(":")
        if base.split(".")[-1] == "default" and "::" in base:
            base = base.rsplit(".", 1)[0]
        if base != op:
            continue
        if not sep or which == str(index) or (name and which == name):
            return True
    return False


def rows_valid(m: Any, dims: int) -> Any:
    """Per row of ``m``'s first ``dims`` dimensions: whether any of its values is non-zero."""
    rows = math.prod(m.shape[:dims])
    return (m.reshape(rows, -1) != 0).any(1)


def marker(m: Any, mask: Any) -> tuple[int, int, int] | None:
    """(dims, invalid rows, rows) when ``m`` (an integer or bool output) shares ``mask``'s
    first ``dims`` dimensions and is 0 in every row of them holding an unwritten element; the
    fewest dimensions that do; None when none do."""
    for dims in range(1, min(m.dim(), mask.dim()) + 1):
        if tuple(m.shape[:dims]) != tuple(mask.shape[:dims]):
            return None
        valid = rows_valid(m, dims)
        gaps = mask.reshape(valid.numel(), -1).any(1)
        if not bool((gaps & valid).any()):
            return dims, int((~valid).sum()), valid.numel()
    return None


def invalid_rows(m: Any, shape: tuple[int, ...], dims: int) -> Any:
    """Where marker ``m`` marks rows of an output of ``shape`` invalid: bool, shaped to
    broadcast over the output (None: the marker does not fit this output)."""
    if m.dim() < dims or len(shape) < dims or tuple(m.shape[:dims]) != tuple(shape[:dims]):
        return None
    invalid = ~rows_valid(m, dims)
    return invalid.reshape(*shape[:dims], *([1] * (len(shape) - dims)))


def left_out(op: str, outs: list[Any], fn: Any = None) -> dict[int, Any]:
    """For a call of ``op`` (the callable ``fn``) with outputs ``outs``: by output index, the
    elements a comparison of results leaves out: those of each convention output that its
    marker marks invalid in this call, and all of an output declared in
    ``GPUCHECK_UNWRITTEN``."""
    found = {}
    for i, conv in conventions(op).items():
        if i < len(outs) and conv.marker < len(outs):
            mask = invalid_rows(outs[conv.marker], tuple(outs[i].shape), conv.dims)
            if mask is not None:
                found[i] = mask
    if os.environ.get(UNWRITTEN_ENV):
        torch = sys.modules["torch"]
        names = output_names(fn)
        for i, t in enumerate(outs):
            if declared(op, i, names[i] if i < len(names) and names[i] else None):
                found[i] = torch.ones((), dtype=torch.bool, device=t.device)
    return found
