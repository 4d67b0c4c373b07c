"""The same values in another memory layout, and how far two results of one call are apart:
the pieces of the memory-layout check (:mod:`gpucheck.detectors.memory_layout`), plain tensor
functions.

A layout here is a tensor's strides and storage offset. :func:`other_layout` gives the values
of a tensor in one that a kernel indexing its memory as if it were contiguous reads wrongly:
a contiguous copy of a tensor the case passed non-contiguous; channels-last for a contiguous
4-D tensor; otherwise the values stored with two dimensions swapped and viewed back (the
tensor's own shape, other strides), or, for a tensor with one dimension of more than one
element, every other element of a buffer twice its size; in each case at a storage offset
of 16 bytes (:data:`OFFSET_BYTES`: an offset that keeps the 16-byte alignment vectorized
loads need). Every element of the buffer behind it, gaps and offset included, holds one of
the tensor's own values: an index tensor read wrongly still holds valid indices.

:func:`compare` measures two outputs of one call element by element: integers and booleans
must be equal; floating-point values within the rounding of their dtype (:data:`RTOL`,
relative to the larger of the two outputs' largest magnitudes), because a correct extension
that calls torch's own ops (a matmul, a reduction) on a non-contiguous tensor may get another
kernel, summing in another order; a kernel that reads the wrong elements is off by about the
values themselves. Only elements finite in both are compared, and only those a ``keep`` mask
leaves in.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

#: the storage offset of every other layout, in bytes (one element at least)
OFFSET_BYTES = 16
#: floating-point tolerance relative to an output's largest magnitude, by itemsize (float64,
#: float32, half, the float8 types); bfloat16 has its own
RTOL = {8: 1e-9, 4: 1e-3, 2: 1e-2, 1: 0.25}
RTOL_BFLOAT16 = 5e-2


def contiguous_strides(shape: tuple[int, ...] | list[int]) -> list[int]:
    """The strides of a contiguous tensor of ``shape``."""
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * max(int(shape[d + 1]), 1)
    return strides


def offset_of(t: Any) -> int:
    """The storage offset (in elements) every other layout of ``t`` sits at."""
    return max(1, OFFSET_BYTES // t.element_size())


def target_strides(t: Any) -> tuple[list[int], str]:
    """The strides of the other layout of ``t`` and its name (see the module text)."""
    shape = [int(n) for n in t.shape]
    if not t.is_contiguous():
        return contiguous_strides(shape), "contiguous"
    if t.dim() == 4 and shape[1] > 1 and shape[2] * shape[3] > 1:
        _, c, h, w = shape
        return [c * h * w, 1, w * c, c], "channels-last"
    big = [d for d, n in enumerate(shape) if n > 1]
    if len(big) >= 2:
        a, b = big[-2], big[-1]
        order = list(range(len(shape)))
        order[a], order[b] = order[b], order[a]
        packed = contiguous_strides([shape[d] for d in order])
        strides = [0] * len(shape)
        for i, d in enumerate(order):
            strides[d] = packed[i]
        return strides, f"stored with dimensions {a} and {b} swapped"
    return [2 * s for s in contiguous_strides(shape)], "every other element of a buffer"


def laid_out(t: Any, strides: list[int], offset: int) -> Any:
    """A new tensor with the values of ``t`` (detached), its shape, ``strides`` and storage
    ``offset``; the rest of its buffer holds the values of ``t`` repeated."""
    torch = sys.modules["torch"]
    shape = [int(n) for n in t.shape]
    extent = offset + 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    flat = t.detach().reshape(-1)
    buf = torch.empty(extent, dtype=t.dtype, device=t.device)
    buf.copy_(flat.repeat(-(-extent // flat.numel()))[:extent])
    view = buf.as_strided(shape, strides, offset)
    view.copy_(t.detach())
    return view


def other_layout(t: Any) -> tuple[Any, str]:
    """``t``'s values in another layout (see the module text), and its description."""
    strides, name = target_strides(t)
    offset = offset_of(t)
    return laid_out(
        t, strides, offset
    ), f"{name} (strides {tuple(strides)}, storage offset {offset})"


def at_offset(t: Any) -> tuple[Any, str]:
    """``t``'s values in its own strides at the storage offset of :func:`other_layout`."""
    offset = offset_of(t)
    return (
        laid_out(t, [int(s) for s in t.stride()], offset),
        f"its own strides at storage offset {offset}",
    )


def describe(t: Any) -> str:
    """How ``t`` is laid out: ``contiguous``, or its strides (and offset)."""
    offset = int(t.storage_offset())
    where = f", storage offset {offset}" if offset else ""
    if t.is_contiguous():
        return "contiguous" + where
    return f"non-contiguous (strides {tuple(int(s) for s in t.stride())}{where})"


@dataclass
class Gap:
    """How far one output of a call is from the same output of the call as the case made it."""

    label: str  # "output 1", "argument 8 (y), written by the call"
    compared: int  # elements compared
    differing: int
    max_abs: float
    max_rel: float  # over the differing elements whose value in the case's call is not 0
    tolerance: float  # the absolute tolerance used (0: exact)
    mask: Any = None  # bool tensor: where they differ (None: the shapes differ)
    note: str = ""  # why they could not be compared element by element

    def text(self) -> str:
        if self.note:
            return f"{self.label}: {self.note}"
        tol = f", tolerance {self.tolerance:.3g}" if self.tolerance else ", exact"
        return (
            f"{self.label}: {self.differing} of {self.compared} elements differ (largest "
            f"absolute error {self.max_abs:.4g}, largest relative error {self.max_rel:.4g}{tol})"
        )


def rtol(dtype: Any) -> float:
    """The relative tolerance of a dtype (0: compared exactly)."""
    torch = sys.modules["torch"]
    if dtype == torch.bfloat16:
        return RTOL_BFLOAT16
    if dtype.is_floating_point or dtype.is_complex:
        size = torch.empty((), dtype=dtype).element_size()
        return RTOL.get(size // 2 if dtype.is_complex else size, RTOL[2])
    return 0.0


def compare(label: str, base: Any, other: Any, keep: Any = None) -> Gap:
    """How far ``other`` is from ``base`` (two tensors: one output of two calls), on the
    elements ``keep`` (a bool tensor of base's shape, or None) leaves in."""
    torch = sys.modules["torch"]
    if tuple(base.shape) != tuple(other.shape) or base.dtype != other.dtype:
        got = f"{list(other.shape)} {other.dtype}"
        note = f"shape {got} instead of {list(base.shape)} {base.dtype}"
        return Gap(label, 0, 1, 0.0, 0.0, 0.0, None, note=note)
    b = base.detach()
    o = other.detach().to(b.device)
    if b.dtype.is_complex:
        b, o = torch.view_as_real(b), torch.view_as_real(o)
        keep = None if keep is None else keep.unsqueeze(-1).expand(b.shape)
    tol_rel = rtol(base.dtype)
    if b.dtype.is_floating_point:
        wide = torch.float64 if b.dtype == torch.float64 else torch.float32
        b, o = b.to(wide), o.to(wide)
        finite = torch.isfinite(b) & torch.isfinite(o)
        inside = finite if keep is None else finite & keep.to(b.device)
        scale = torch.where(inside, torch.maximum(b.abs(), o.abs()), 0).max()
        d = torch.where(inside, (o - b).abs(), 0)
        tol = tol_rel * scale
        diff = d > tol
    else:
        inside = torch.ones_like(b, dtype=torch.bool) if keep is None else keep.to(b.device)
        diff = (b != o) & inside
        d = torch.where(diff, (o.to(torch.float64) - b.to(torch.float64)).abs(), 0)
        b = b.to(torch.float64)
        tol = torch.zeros((), dtype=torch.float64, device=b.device)
    rel = torch.where(diff & (b != 0), d / b.abs().clamp_min(1e-300), 0)
    numbers = torch.stack(
        [
            inside.sum().to(torch.float64),
            diff.sum().to(torch.float64),
            d.max().to(torch.float64) if d.numel() else d.new_zeros(()).to(torch.float64),
            rel.max().to(torch.float64) if rel.numel() else rel.new_zeros(()).to(torch.float64),
            torch.as_tensor(tol, dtype=torch.float64, device=b.device),
        ]
    ).tolist()
    compared, differing, max_abs, max_rel, tolerance = numbers
    mask = diff.any(-1) if base.dtype.is_complex else diff
    return Gap(label, int(compared), int(differing), max_abs, max_rel, tolerance, mask)


def disagree(a: Any, b: Any) -> Any:
    """Where two outputs of one call (one shape and dtype) disagree, a bool tensor: other
    values beyond the dtype's rounding, or a value finite in one and not in the other bits;
    None when their shapes or dtypes differ."""
    torch = sys.modules["torch"]
    gap = compare("", a, b)
    if gap.mask is None:
        return None
    x, y = a.detach(), b.detach().to(a.device)
    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        return gap.mask
    if x.dtype.is_complex:
        x, y = torch.view_as_real(x), torch.view_as_real(y)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    odd = ~(torch.isfinite(x) & torch.isfinite(y)) & (x.view(ints) != y.view(ints))
    if a.dtype.is_complex:
        odd = odd.any(-1)
    return gap.mask | odd
