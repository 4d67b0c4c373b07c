"""oom-anomaly: an out-of-memory that is a bug, not a full GPU, at the failure.

Parent side, over the case records of a run:

* **At the failure.** A case that failed with ``torch.OutOfMemoryError`` / ``CUDA out of
  memory`` carries the message in its failure finding; :func:`parse_oom` reads every wording
  of torch >= 2.0 (requested, total capacity, free, allowed, this process's use, allocated by
  PyTorch, in private pools, reserved but unallocated — or, before 2.1, reserved in total).
  A request larger than the whole device, or :data:`FAR_BEYOND` times the case's measured
  footprint (and at least :data:`MIN_ANOMALY` bytes), is an anomaly (error) with the numbers
  and a hint; any other OOM is reported with its numbers, as fragmentation (warning) when the
  memory reserved but unallocated would have covered the request.
* **The rasterizer's preflight.** ``gpucheck.MemoryAnomalyError`` (raised before any binning
  buffer is allocated) is matched by its type name in the failure text and its message parsed
  (:func:`parse_memory_anomaly`): Gaussians, visible, overlaps, bytes needed and free, radius
  percentiles, share of huge Gaussians and its hint become the finding.

Peak memory that grows too fast over a test's sizes is :mod:`gpucheck.detectors.memory_growth`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from gpucheck.detectors.base import BaseDetector
from gpucheck.model.kinds import SYMPTOM, Kind
from gpucheck.model.modes import try_parse
from gpucheck.model.results import CaseRecord, Finding

__all__ = [
    "MemoryAnomaly",
    "OomAnomaly",
    "OomMessage",
    "oom_findings",
    "parse_memory_anomaly",
    "parse_oom",
]

#: a request this many times the case's measured footprint is an anomaly
FAR_BEYOND = 8.0
#: ... when it is at least this large
MIN_ANOMALY = 1 << 30

_UNITS = {"bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE = r"(\d+(?:\.\d+)?) ?(bytes|B|KiB|MiB|GiB|TiB)"
_PATTERNS = {
    "requested": rf"Tried to allocate {_SIZE}",
    # >= 2.1: "GPU 0 has a total capacity of X of which Y is free" (2.1 spelled "capacty")
    "total": rf"total capac(?:i)?ty of {_SIZE}|; {_SIZE} total capacity",
    "free": rf"of which {_SIZE} is free|; {_SIZE} free",
    "allowed": rf"{_SIZE} allowed",
    "process_in_use": rf"this process has {_SIZE} memory in use",
    "allocated": rf"Of the allocated memory {_SIZE} is allocated by PyTorch|"
    rf"; {_SIZE} already allocated",
    "private_pools": rf"with {_SIZE} allocated in private pools",
    "reserved_unallocated": rf"{_SIZE} is reserved by PyTorch but unallocated",
    "reserved_total": rf"{_SIZE} reserved in total by PyTorch",
}
_GPU = re.compile(r"\(GPU (\d+);|GPU (\d+) has a total")
_OOM = re.compile(r"(?:CUDA|HIP|XPU|MPS)? ?out of memory", re.I)
_ANOMALY_TYPE = "MemoryAnomalyError"
_BUDGET = re.compile(
    r"(?P<n>\d+) Gaussians \((?P<visible>\d+) visible\) touch (?P<overlaps>\d+) tiles in "
    r"total.*?binning needs (?P<needed>\d+) bytes, (?P<free>\d+) bytes free(?:; radius "
    r"percentiles \(visible, px\) p50 (?P<p50>\d+), p90 (?P<p90>\d+), p99 (?P<p99>\d+), "
    r"max (?P<max>\d+); \d+ Gaussians \((?P<share>[0-9.e+-]+) %\) cover more than 25 % of "
    r"the image\.)?(?: Hint: (?P<hint>[^\n]*))?",
    re.S,
)


def _bytes(value: str, unit: str) -> int:
    return round(float(value) * _UNITS[unit])


@dataclass
class OomMessage:
    """The numbers of one out-of-memory message (bytes; None where the wording has none)."""

    text: str
    gpu: int | None = None
    requested: int | None = None
    total: int | None = None
    free: int | None = None
    allowed: int | None = None
    process_in_use: int | None = None
    allocated: int | None = None
    private_pools: int | None = None
    reserved_unallocated: int | None = None
    reserved_total: int | None = None

    @property
    def reserved(self) -> int | None:
        """Reserved by PyTorch in total (>= 2.1: allocated + private + unallocated)."""
        if self.reserved_total is not None:
            return self.reserved_total
        if self.allocated is None or self.reserved_unallocated is None:
            return None
        return self.allocated + (self.private_pools or 0) + self.reserved_unallocated

    @property
    def unallocated(self) -> int | None:
        """Reserved by PyTorch but unallocated (holes in its cached segments)."""
        if self.reserved_unallocated is not None:
            return self.reserved_unallocated
        if self.reserved_total is not None and self.allocated is not None:
            return max(0, self.reserved_total - self.allocated)
        return None


def _oom_line(text: str) -> str | None:
    """The line of ``text`` holding the out-of-memory message (the longest such line: the
    exception's own, not a traceback's short summary)."""
    lines = [ln for ln in text.splitlines() if _OOM.search(ln)]
    if not lines:
        return None
    return max(lines, key=len).strip().removeprefix("E").strip()


def parse_oom(text: str) -> OomMessage | None:
    """The numbers of the out-of-memory message in ``text`` (a message, a traceback, pytest's
    failure text), or None when it holds none."""
    line = _oom_line(text)
    if line is None or _ANOMALY_TYPE in line:
        return None
    msg = OomMessage(text=line)
    for name, pattern in _PATTERNS.items():
        found = re.search(pattern, line)
        if found:
            value, unit = next(
                (v, u)
                for v, u in zip(found.groups()[::2], found.groups()[1::2], strict=True)
                if v is not None
            )
            setattr(msg, name, _bytes(value, unit))
    gpu = _GPU.search(line)
    if gpu:
        msg.gpu = int(gpu.group(1) or gpu.group(2))
    return msg


@dataclass
class MemoryAnomaly:
    """The fields of a ``MemoryAnomalyError`` message (the rasterizer's preflight)."""

    text: str
    n: int | None = None
    visible: int | None = None
    overlaps: int | None = None
    bytes_needed: int | None = None
    bytes_free: int | None = None
    radius_percentiles: dict[str, int] | None = None
    share_huge: float | None = None
    hint: str | None = None


def parse_memory_anomaly(text: str) -> MemoryAnomaly | None:
    """The rasterizer's preflight error in ``text`` (matched by the exception's type name
    ``MemoryAnomalyError``, or by the preflight's "binning budget exceeded"), or None."""
    if _ANOMALY_TYPE not in text and "binning budget exceeded" not in text:
        return None
    lines = [ln for ln in text.splitlines() if "binning budget exceeded" in ln] or [
        ln for ln in text.splitlines() if _ANOMALY_TYPE in ln
    ]
    line = max(lines, key=len).strip().removeprefix("E").strip()
    out = MemoryAnomaly(text=line)
    found = _BUDGET.search(line)
    if found:
        out.n, out.visible, out.overlaps = (int(found[k]) for k in ("n", "visible", "overlaps"))
        out.bytes_needed, out.bytes_free = int(found["needed"]), int(found["free"])
        if found["p50"] is not None:
            out.radius_percentiles = {k: int(found[k]) for k in ("p50", "p90", "p99", "max")}
            out.share_huge = float(found["share"]) / 100.0
        out.hint = found["hint"].strip() if found["hint"] else None
    return out


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.2f} GiB"


def _failure_text(r: CaseRecord) -> str:
    return "\n".join(
        f"{f.message}\n{f.evidence or ''}"
        for f in r.findings
        if f.kind in ("test-failure", "cuda-error")
    )


def _footprint(r: CaseRecord, m: OomMessage) -> int:
    return max(r.memory.torch_peak_allocated or 0, m.allocated or 0)


def _oom_finding(r: CaseRecord, m: OomMessage, totals: dict[str, int]) -> Finding:
    total = m.total or totals.get(r.device)
    footprint = _footprint(r, m)
    numbers = json_numbers(m)
    req = m.requested
    if req is not None and total and req > total:
        return r.info.finding(
            "oom-anomaly",
            "error",
            f"out of memory: a single request of {gib(req)} on a device of "
            f"{gib(total)} in total, {req / total:.1f}x the whole device",
            evidence=f"{numbers}\n{m.text}",
            hint=_HINT_HUGE,
        )
    if req is not None and req >= MIN_ANOMALY and req > FAR_BEYOND * max(footprint, 1):
        return r.info.finding(
            "oom-anomaly",
            "error",
            f"out of memory: a request of {gib(req)}, {req / max(footprint, 1):.0f}x "
            f"the case's measured footprint of {gib(footprint)}",
            evidence=f"{numbers}\ncase footprint (PyTorch peak allocated): {footprint} "
            f"bytes\n{m.text}",
            hint=_HINT_HUGE,
        )
    holes = m.unallocated
    headroom = m.free
    if m.allowed is not None and m.reserved is not None:  # set_per_process_memory_fraction
        headroom = min(headroom if headroom is not None else m.allowed, m.allowed - m.reserved)
    if (
        req is not None
        and holes is not None
        and holes >= req / 4
        and holes + max(headroom or 0, 0) >= req
    ):
        return r.info.finding(
            "oom",
            "warning",
            f"out of memory from fragmentation: {gib(holes)} reserved by PyTorch but "
            f"unallocated (holes in its cached segments), which with the "
            f"{gib(max(headroom or 0, 0))} still available would have held the "
            f"{gib(req)} requested",
            evidence=f"{numbers}\n{m.text}",
            hint="the cached segments have holes that no single request fits: set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or allocate long-lived "
            "buffers first and reuse them",
        )
    cap = f", the process limited to {gib(m.allowed)}" if m.allowed is not None else ""
    return r.info.finding(
        "oom",
        "info",
        (
            f"out of memory: {gib(req)} requested, {gib(m.free)} free of {gib(total)}"
            f"{cap} ({gib(m.allocated)} allocated by PyTorch)"
        )
        if req is not None
        else "out of memory (the message gives no sizes: a raw CUDA allocation failed)",
        evidence=f"{numbers}\n{m.text}",
        hint="the device (or the process's share of it) was full: a smaller batch or "
        "resolution, or another process's memory",
    )


_HINT_HUGE = (
    "a size computed wrongly rather than a full GPU: look for values activated twice "
    "(exp of scales that were already exponentiated: `gpucheck lint-checkpoint`), a "
    "shape multiplied instead of added, or an element count used as a byte count"
)


def json_numbers(m: OomMessage) -> str:
    keep = {k: v for k, v in asdict(m).items() if k != "text" and v is not None}
    return "parsed: " + ", ".join(f"{k}={v}" for k, v in keep.items())


def _anomaly_finding(r: CaseRecord, a: MemoryAnomaly) -> Finding:
    if a.overlaps is not None:
        pct = a.radius_percentiles or {}
        what = (
            f"{a.n:,} Gaussians ({a.visible:,} visible) would touch {a.overlaps:,} tiles: "
            f"binning needs {gib(a.bytes_needed)}, {gib(a.bytes_free)} free"
        )
        extra = (
            f"; radius p50 {pct.get('p50')} px, p99 {pct.get('p99')} px; "
            f"{a.share_huge:.0%} of the Gaussians cover more than 25 % of the image"
            if pct and a.share_huge is not None
            else ""
        )
    else:
        what, extra = "the rasterizer's memory preflight refused the render", ""
    return r.info.finding(
        "oom-anomaly",
        "error",
        f"memory anomaly before the render: {what}{extra}",
        evidence=a.text,
        hint=a.hint or _HINT_HUGE,
        op=None,
    )


def oom_findings(
    records: Iterable[CaseRecord], totals: dict[str, int] | None = None
) -> list[Finding]:
    """Findings for the case records that failed with an out-of-memory or the rasterizer's
    memory anomaly (``totals``: device label -> bytes, from the run header)."""
    totals = totals or {}
    found = []
    for r in records:
        mode = try_parse(r.mode)
        if mode is not None and mode.rerun:
            continue  # the wrong-device check's re-runs repeat the same failure
        text = _failure_text(r)
        if not text:
            continue
        anomaly = parse_memory_anomaly(text)
        if anomaly is not None:
            found.append(_anomaly_finding(r, anomaly))
            continue
        oom = parse_oom(text)
        if oom is not None:
            found.append(_oom_finding(r, oom, totals))
    return found


#: an allocation far beyond what the case should need (its cause), and an out-of-memory error
#: nothing explains (how it looked)
OOM_ANOMALY = Kind("oom-anomaly", precedence=70)
OOM = Kind("oom", SYMPTOM)


class OomAnomaly(BaseDetector):
    """Parent side: OOM messages and preflight errors of failed cases."""

    name = "oom-anomaly"
    kinds = (OOM_ANOMALY, OOM)

    def __init__(self, totals: dict[str, int] | None = None) -> None:
        self.totals = totals or {}

    def run_finished(self, records: list[CaseRecord]) -> list[Finding]:
        return oom_findings(records, self.totals)
