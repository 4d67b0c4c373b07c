"""memory-growth: peak memory that grows too fast over a test's sizes, before any failure.

Parent side, over the case records of a run: cases parametrized by a size (the one integer
parameter that varies among the cases of one test function on one device) have their own peak
memory (:attr:`~gpucheck.model.memory.Memory.own_peak`) fitted over the sizes
(:func:`growth`): a log-log slope above :data:`SUPERLINEAR` between the two largest sizes is a
``memory-growth`` warning; when the next size (the same step again, for steps of at most
:data:`MAX_STEP`: a sweep, not a list of unrelated shapes) would need more than the device
holds, an error."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from gpucheck.detectors.base import BaseDetector
from gpucheck.detectors.oom_anomaly import gib
from gpucheck.model.kinds import Kind
from gpucheck.model.results import CaseRecord, Finding

__all__ = ["MemoryGrowth", "growth", "size_of"]

#: log-log slope of peak memory over size above which growth is superlinear
SUPERLINEAR = 1.5
#: growth is judged only when the largest size's peak is at least this
MIN_GROWTH_PEAK = 8 << 20
#: the next size is predicted only when the two largest sizes are at most this far apart (a
#: suite's 1x1, 11x11, 1080x1920 images are shapes, not a sweep to extrapolate 226x further)
MAX_STEP = 4.0


_PARAMS = re.compile(r"^(?P<base>[^\[]+)\[(?P<params>.*)\]$")
_DIMS = re.compile(r"^(?:[A-Za-z_]\w*=|[A-Za-z])?(\d+(?:x\d+)*)$")
_DEVICE = re.compile(r"^cuda:?\d+$|^cpu$")


def size_of(token: str) -> int | None:
    """The size a parameter id stands for: ``4096``, ``n4096``, ``n=4096``, ``1920x1080``
    (the product); None for anything else."""
    found = _DIMS.match(token)
    if not found:
        return None
    return math.prod(int(d) for d in found.group(1).split("x"))


def _sized(records: Iterable[CaseRecord]) -> dict[tuple[Any, ...], list[tuple[int, CaseRecord]]]:
    """Records grouped by (device, suite, mode, test function, the other parameters), each
    with its size: the one parameter position whose numeric value varies in the group."""
    groups: dict[tuple[Any, ...], list[tuple[list[str], CaseRecord]]] = {}
    for r in records:
        m = _PARAMS.match(r.case)
        if m is None or r.status != "passed":
            continue
        tokens = m.group("params").split("-")
        key = (r.device, r.suite, r.mode, m.group("base"), len(tokens))
        groups.setdefault(key, []).append((tokens, r))
    out: dict[tuple[Any, ...], list[tuple[int, CaseRecord]]] = {}
    for key, members in groups.items():
        width = key[-1]
        varying = [i for i in range(width) if len({t[i] for t, _ in members}) > 1]
        for i in varying:
            if _DEVICE.match(members[0][0][i]) or any(size_of(t[i]) is None for t, _ in members):
                continue
            others = [j for j in varying if j != i]
            for tokens, r in members:
                sub = (*key, i, tuple(tokens[j] for j in others))
                out.setdefault(sub, []).append((size_of(tokens[i]) or 0, r))
    return out


def growth(records: Iterable[CaseRecord], totals: dict[str, int] | None = None) -> list[Finding]:
    """``memory-growth`` findings for size-parametrized cases whose peak memory grows faster
    than :data:`SUPERLINEAR` in the size, or whose next size would not fit the device."""
    totals = totals or {}
    found = []
    for key, members in _sized(records).items():
        points = sorted({s: p for s, r in members if s > 0 and (p := r.memory.own_peak)}.items())
        if len(points) < 2:
            continue
        (s1, p1), (s2, p2) = points[-2], points[-1]
        if p2 < MIN_GROWTH_PEAK or p2 <= p1:
            continue
        slope = math.log(p2 / p1) / math.log(s2 / s1)
        total = totals.get(str(key[0]))
        next_size = s2 * s2 / s1
        predicted = p2 * (next_size / s2) ** slope
        beyond = total is not None and s2 <= MAX_STEP * s1 and predicted > total
        if slope < SUPERLINEAR and not beyond:
            continue
        largest = next(r for s, r in members if s == s2)
        fit = ", ".join(f"{s:,}: {p / (1 << 20):.1f} MiB" for s, p in points)
        message = (
            f"peak memory grows as size^{slope:.2f} over the sizes of this test "
            f"(PyTorch peak allocated {fit})"
        )
        if beyond:
            message += (
                f"; the next size ({next_size:,.0f}) would need about "
                f"{gib(int(predicted))}, more than the device's {gib(total)}"
            )
        found.append(
            largest.info.finding(
                "memory-growth",
                "error" if beyond else "warning",
                message,
                evidence=f"log-log slope between the two largest sizes {s1:,} and {s2:,}: "
                f"{slope:.3f}; peaks: {fit}; predicted at {next_size:,.0f}: "
                f"{int(predicted)} bytes" + (f" (device total {total})" if total else ""),
                hint="a buffer sized by size^2 (a pairwise matrix, a dense scratch) where a "
                "linear one would do; tile it, or bound it by a budget",
            )
        )
    return found


#: peak memory that grows faster than the case's size across its parameters
MEMORY_GROWTH = Kind("memory-growth", precedence=130)


class MemoryGrowth(BaseDetector):
    """Parent side: peak memory over the sizes of size-parametrized cases."""

    name = "memory-growth"
    kinds = (MEMORY_GROWTH,)

    def __init__(self, totals: dict[str, int] | None = None) -> None:
        self.totals = totals or {}

    def run_finished(self, records: list[CaseRecord]) -> list[Finding]:
        return growth(records, self.totals)
