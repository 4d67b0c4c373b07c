"""A case record's ``numerics``: each comparison of a result against its reference.

:func:`gpucheck.testing.assert_close` measures one comparison (a :class:`Measured`); the
``numerics`` detector keeps every comparison of a case in its record, so a report shows how
close each check came to its tolerance. A dtype-coverage check
(:func:`gpucheck.testing.check_dtypes`) is a :class:`Measured` without shape or dtype.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


def _maybe(value: Any) -> float | None:
    """A number as read (infinity and NaN kept: an error may be infinite), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _float(value: Any, default: float = 0.0) -> float:
    found = _maybe(value)
    return default if found is None else found


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _ints(value: Any) -> list[int] | None:
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        return None
    return list(value)


@dataclass
class Measured:
    """One comparison against a reference."""

    what: str
    ok: bool
    shape: list[int]
    dtype: str
    rtol: float
    atol: float
    max_abs: float
    max_rel: float
    worst_index: list[int] | None
    got_at_worst: float | None
    want_at_worst: float | None
    mismatched: int
    total: int
    nan_mismatch: int

    @property
    def coverage(self) -> bool:
        """A dtype-coverage check (:func:`check_dtypes`), not a comparison of values."""
        return not self.shape and not self.dtype

    def message(self) -> str:
        if self.coverage:
            return self.what
        if self.ok:
            return f"{self.what}: within tolerance (max abs error {self.max_abs:.3g})"
        where = (
            f" at {tuple(self.worst_index)} (got {self.got_at_worst!r}, reference "
            f"{self.want_at_worst!r})"
            if self.worst_index is not None
            else ""
        )
        nans = (
            f"; {self.nan_mismatch} NaN where the reference has none (or the reverse)"
            if self.nan_mismatch
            else ""
        )
        return (
            f"{self.what}: {self.mismatched} of {self.total} elements out of tolerance "
            f"(rtol {self.rtol:g}, atol {self.atol:g}); max abs error {self.max_abs:.3g}"
            f"{where}, max rel error {self.max_rel:.3g}{nans}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Any) -> Measured | None:
        """A comparison as read back, or None when it is not one (not an object, or without
        what it compared). Tolerant: a number that is not one reads as 0 (an error as
        ``nan``: unknown, not within tolerance), ``ok`` only when it says ``true``."""
        if not isinstance(value, dict) or not isinstance(value.get("what"), str):
            return None
        dtype = value.get("dtype")
        return cls(
            what=value["what"][:2000],
            ok=value.get("ok") is True,
            shape=_ints(value.get("shape")) or [],
            dtype=dtype[:100] if isinstance(dtype, str) else "",
            rtol=_float(value.get("rtol")),
            atol=_float(value.get("atol")),
            max_abs=_float(value.get("max_abs"), math.nan),
            max_rel=_float(value.get("max_rel"), math.nan),
            worst_index=_ints(value.get("worst_index")),
            got_at_worst=_maybe(value.get("got_at_worst")),
            want_at_worst=_maybe(value.get("want_at_worst")),
            mismatched=_count(value.get("mismatched")),
            total=_count(value.get("total")),
            nan_mismatch=_count(value.get("nan_mismatch")),
        )
