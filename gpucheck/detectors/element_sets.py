"""The shape of a set of tensor elements, in words: every element, whole rows, square tiles
over two dimensions, whole entries of the leading dimensions, a tail, or scattered elements
(what an unwritten-output finding says of the elements a call never wrote)."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

#: values shown from a set
MAX_SAMPLES = 5
#: rows or elements named in a description
MAX_SHOWN = 4
#: tile sizes tried, largest first (the rasterizers' tiles are 16×16)
TILES = (32, 16, 8)


def samples(t: Any, mask: Any, n: int = MAX_SAMPLES) -> list[str]:
    """The first ``n`` values of ``t`` where ``mask`` holds, as text."""
    index = mask.reshape(-1).nonzero().flatten()[:n]
    values = t.detach().reshape(-1)[index].tolist()
    return [f"{v:.3g}" if isinstance(v, float) else str(v) for v in values]


def _listed(items: list[Any], total: int) -> str:
    shown = ", ".join(str(tuple(x)) if isinstance(x, list) else str(x) for x in items)
    return shown + (", …" if total > len(items) else "")


def describe(mask: Any) -> str:
    """The shape of a set of elements (``mask``: bool): every element, whole rows along dim
    0, a pattern of square tiles over two adjacent dimensions, whole entries of the leading
    dimensions, a tail, or scattered elements."""
    n, k, shape = mask.numel(), int(mask.sum()), tuple(mask.shape)
    if k == n:
        return "every element"
    if mask.dim() >= 2 and (rows := _whole_rows(mask, 1)) is not None:
        return rows
    tiles = _tiles(mask)
    if tiles is not None:
        return tiles
    for dims in range(2, mask.dim()):
        if (rows := _whole_rows(mask, dims)) is not None:
            return rows
    flat = mask.reshape(-1)
    if bool(flat[n - k :].all()):
        return f"a tail: the last {k} elements (from flat index {n - k})"
    first = mask.nonzero()[:MAX_SHOWN].tolist() if len(shape) > 1 else None
    if first is None:
        first = flat.nonzero().flatten()[:MAX_SHOWN].tolist()
    return f"{k} scattered elements ({_listed(first, k)})"


def _whole_rows(mask: Any, dims: int) -> str | None:
    shape = tuple(mask.shape)
    rows = math.prod(shape[:dims])
    per_row = mask.reshape(rows, -1)
    full = per_row.all(1)
    if not bool((full == per_row.any(1)).all()):
        return None
    index = full.nonzero().flatten()[:MAX_SHOWN].tolist()
    count = int(full.sum())
    if dims == 1:
        return f"whole rows: {count} of {rows} rows along dim 0 ({_listed(index, count)})"
    shown = [list(_unravel(i, shape[:dims])) for i in index]
    return (
        f"whole entries of the leading {dims} dims {list(shape[:dims])}: {count} of {rows} "
        f"({_listed(shown, count)})"
    )


def _unravel(i: int, shape: tuple[int, ...]) -> Iterator[int]:
    out = []
    for size in reversed(shape):
        out.append(i % size)
        i //= size
    return reversed(out)


def _tiles(mask: Any) -> str | None:
    """``16 of 64 tiles of 16×16 over dims 0, 1 (113×203)`` when the set is whole square tiles of
    two adjacent dimensions (of at least 8 elements each), alike in every other dimension."""
    torch = sys.modules["torch"]
    for i in range(mask.dim() - 1):
        h, w = int(mask.shape[i]), int(mask.shape[i + 1])
        if h < 8 or w < 8:
            continue
        planes = mask.movedim((i, i + 1), (-2, -1)).reshape(-1, h, w)
        image = planes.any(0)
        if not torch.equal(image, planes.all(0)):
            continue
        for t in TILES:
            hb, wb = -(-h // t), -(-w // t)
            grid = torch.zeros(hb * t, wb * t, dtype=torch.int32, device=mask.device)
            grid[:h, :w] = image.int()
            inside = torch.zeros_like(grid)
            inside[:h, :w] = 1
            count = grid.reshape(hb, t, wb, t).sum((1, 3))
            size = inside.reshape(hb, t, wb, t).sum((1, 3))
            if bool(((count == 0) | (count == size)).all()):
                tiles = int((count > 0).sum())
                return f"{tiles} of {hb * wb} tiles of {t}×{t} over dims {i}, {i + 1} ({h}×{w})"
    return None
