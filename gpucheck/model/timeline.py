"""The NVML timeline (``RUN/nvml_timeline.jsonl``, :data:`gpucheck.model.layout.TIMELINE`):
one line per sample of every GPU, written by the controller's sampler
(:class:`TimelineWriter`), read by the report (:func:`samples`).

A line is ``{"t": epoch seconds, "devices": [row, ...]}``, a row
``{"nvml_index", "uuid", "used": bytes or null, "processes": {pid: bytes} or null, "error"?}``
(``processes`` null and ``error`` set: NVML could not list the device's processes in that
sample). A line someone else wrote may be anything: :func:`parse` turns each into a
:class:`Sample` or says it is torn, never lets another type through.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucheck.model.layout import open_regular

#: seconds between two samples of mode nvml (``--nvml-interval``; gpucheck.nvml_sampler)
DEFAULT_INTERVAL_S = 0.05
#: what reading a line someone else wrote may raise (not JSON, fields of other types,
#: numbers out of range): the line is torn
BAD_LINE = (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError)


@dataclass
class DeviceRow:
    """One GPU in one sample."""

    nvml_index: int | None
    uuid: str
    used: int | None  # the GPU's used memory (None: not asked, or NVML did not say)
    processes: dict[str, int | None] | None  # pid -> bytes; None: NVML failed to list them
    error: str | None = None  # why NVML failed in this sample

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "nvml_index": self.nvml_index,
            "uuid": self.uuid,
            "used": self.used,
            "processes": self.processes,
        }
        if self.error:
            row["error"] = self.error
        return row

    @classmethod
    def from_json(cls, row: Any) -> DeviceRow:
        """A row as read back; raises one of :data:`BAD_LINE` where it is not one."""
        index = row.get("nvml_index")
        used = row.get("used")
        procs = row.get("processes")
        return cls(
            nvml_index=None if index is None else int(index),
            uuid=str(row.get("uuid")),
            used=None if used is None else _bytes(used),
            processes=None
            if procs is None
            else {str(pid): _bytes(b or 0) for pid, b in procs.items()},
            error=None if row.get("error") is None else str(row["error"]),
        )


def _bytes(value: Any) -> int:
    number = float(value)  # a string, a list: raises
    if not math.isfinite(number):
        raise ValueError(value)
    return int(number)


@dataclass
class Sample:
    """Every GPU at one moment."""

    t: float
    devices: list[DeviceRow]

    def to_line(self) -> str:
        line = {"t": round(self.t, 3), "devices": [r.to_json() for r in self.devices]}
        return json.dumps(line, separators=(",", ":")) + "\n"


def sample_time(line: bytes | str) -> float | None:
    """The time of one line, or None (not a sample, or not a finite number)."""
    try:
        t = float(json.loads(line)["t"])
    except BAD_LINE:
        return None
    return t if math.isfinite(t) else None


def parse(line: bytes | str) -> Sample:
    """One line as a :class:`Sample`; raises one of :data:`BAD_LINE` where it is torn."""
    value = json.loads(line)
    t = float(value["t"])
    if not math.isfinite(t):
        raise ValueError(t)
    return Sample(t, [DeviceRow.from_json(row) for row in value["devices"]])


def edges(path: Path) -> tuple[float, float] | None:
    """Time of the first and of the last readable sample, without parsing the rest (None:
    no file, or no readable sample)."""
    first = last = None
    f = open_regular(path)
    if f is None:
        return None
    with f:
        for line in f:
            first = sample_time(line)
            if first is not None:
                break
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 65536))
        for line in reversed(f.read().splitlines()):
            last = sample_time(line)
            if last is not None:
                break
    return None if first is None or last is None else (first, max(last, first + 1e-3))


def samples(path: Path) -> Iterator[Sample | None]:
    """Every line of a timeline file as a sample, None for a torn one (nothing for a file
    that is missing or not a regular file)."""
    f = open_regular(path)
    if f is None:
        return
    with f:
        for line in f:
            try:
                yield parse(line)
            except BAD_LINE:
                yield None


class TimelineWriter:
    """The controller's side: every sample of every device as one line (a sampler's
    ``on_sample``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 - closed in close()

    def __call__(self, t: float, rows: list[DeviceRow]) -> None:
        self._f.write(Sample(t, rows).to_line())

    def close(self) -> None:
        self._f.close()
