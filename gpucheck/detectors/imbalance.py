"""imbalance: the same case needs clearly more memory on one device than on another.

The harness runs every case on every target device, with the same inputs. Its peak memory
should then be the same everywhere; a device whose peak is well above the others holds
something the others do not: another device's buffers (a scratch allocated on the current
device instead of the input's), a second CUDA context, a cache keyed by the wrong device.

Parent side, over the case records of the plain passes: records of one (suite, case, mode)
are compared across devices, the device token of the case id (``cuda0``, ``cuda:1``) set
aside. Two measures, each with its own tolerance: PyTorch's peak allocated on the target
device (exact; :data:`TORCH_TOL`) and the memory outside PyTorch's allocator, the worker's
NVML peak on the target device less PyTorch's peak reserved pool (sampled, and with the CUDA
context included; :data:`NVML_TOL`). The pool is left out because it depends on the worker's
history, not on the case: the allocator keeps what earlier cases reserved, so a case run
first by a fresh (resumed) worker and the same case run late in a long one differ by
gigabytes in NVML with the same allocations. A difference counts when the larger peak is more
than ``ratio`` times the smaller *and* more than ``bytes`` above it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpucheck.detectors.base import BaseDetector
from gpucheck.model.kinds import Kind
from gpucheck.model.memory import Memory
from gpucheck.model.modes import try_parse
from gpucheck.model.results import CaseRecord, Finding

__all__ = ["Imbalance", "imbalances"]

#: (ratio, bytes) for PyTorch's peak allocated
TORCH_TOL = (1.5, 32 << 20)
#: (ratio, bytes) for the NVML peak (context and sampling included)
NVML_TOL = (1.25, 256 << 20)
_DEVICE_TOKEN = re.compile(r"(?<=[\[-])cuda:?\d+(?=[\]-])")
HINT = (
    "allocate every buffer with the input's options (`x.options()`, `device=x.device`) "
    "under a device guard; a cache or workspace must be keyed by device"
)


def _key(r: CaseRecord) -> tuple[str, str, str]:
    return (r.suite, _DEVICE_TOKEN.sub("cuda*", r.case), r.mode)


def _allocated(memory: Memory) -> int | None:
    return memory.torch_peak_allocated


def _outside_pool(memory: Memory) -> int | None:
    return memory.outside_pool


def _compare(tol: tuple[float, int], peaks: dict[str, int]) -> tuple[str, str, int, int] | None:
    """(high device, low device, high, low) when they differ beyond ``tol``."""
    if len(peaks) < 2:
        return None
    high = max(peaks, key=lambda d: peaks[d])
    low = min(peaks, key=lambda d: peaks[d])
    ratio, margin = tol
    if peaks[high] > ratio * peaks[low] and peaks[high] - peaks[low] > margin:
        return high, low, peaks[high], peaks[low]
    return None


def imbalances(records: Iterable[CaseRecord]) -> list[Finding]:
    """One finding per (suite, case, mode) whose peaks differ across devices."""
    groups: dict[tuple[str, str, str], list[CaseRecord]] = {}
    for r in records:
        mode = try_parse(r.mode)
        if (
            mode is None
            or mode.sanitizer_tool
            or mode.variant
            or r.status not in ("passed", "failed")
        ):
            continue
        groups.setdefault(_key(r), []).append(r)
    found = []
    for members in groups.values():
        by_device = {r.device: r for r in members}
        if len(by_device) < 2:
            continue
        lines, where = [], None
        for label, measure, tol in (
            ("PyTorch peak allocated", _allocated, TORCH_TOL),
            ("NVML peak outside PyTorch's reserved pool", _outside_pool, NVML_TOL),
        ):
            peaks = {d: v for d, r in by_device.items() if (v := measure(r.memory)) is not None}
            hit = _compare(tol, peaks)
            if hit is None:
                continue
            high, low, hi, lo = hit
            where = where or by_device[high]
            lines.append(
                f"{label}: "
                + ", ".join(f"{d} {b / (1 << 20):.1f} MiB" for d, b in sorted(peaks.items()))
                + f" ({high} holds {(hi - lo) / (1 << 20):.1f} MiB more than {low})"
            )
        if where is None:
            continue
        found.append(
            where.info.finding(
                "imbalance",
                "warning",
                f"the same case needs more memory on {where.device} than on the "
                f"other device(s): {lines[0].split(': ', 1)[1]}",
                evidence="\n".join(lines) + f"\n(tolerances: PyTorch x{TORCH_TOL[0]} and "
                f"+{TORCH_TOL[1] >> 20} MiB; outside the pool x{NVML_TOL[0]} and "
                f"+{NVML_TOL[1] >> 20} MiB)",
                hint=HINT,
            )
        )
    return found


#: one device's case using far more memory than the same case on the others
IMBALANCE = Kind("imbalance")


class Imbalance(BaseDetector):
    """Parent side, over the case records of the plain passes."""

    name = "imbalance"
    kinds = (IMBALANCE,)

    def run_finished(self, records: list[CaseRecord]) -> list[Finding]:
        return imbalances(records)
