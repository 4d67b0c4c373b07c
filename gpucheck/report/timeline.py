"""NVML memory timelines (:mod:`gpucheck.model.timeline`) downsampled for the report.

Each line of the timeline is one sample of every GPU: total used memory and each process's
memory. An hour at 50 ms is 72,000 samples per GPU; the report keeps ``BUCKETS`` time buckets
and the *maximum* of each series in each bucket (a memory peak must never be averaged away).
A process absent from a bucket breaks its line: the line starts when the process creates its
context on that GPU and ends when it exits. The plots drawn from it: :mod:`.plots`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from gpucheck.model import timeline as model_timeline

BUCKETS = 600


@dataclass
class Series:
    """One line of a plot: bucket index -> max value in bytes."""

    name: str
    values: dict[int, int] = field(default_factory=dict)

    def add(self, bucket: int, value: int | None) -> None:
        if value is not None and value > self.values.get(bucket, -1):
            self.values[bucket] = value

    @property
    def peak(self) -> int:
        return max(self.values.values(), default=0)


@dataclass
class DeviceTimeline:
    uuid: str
    nvml_index: int
    label: str  # cuda:N of the run, or "GPU <nvml index> (not targeted)"
    used: Series
    processes: dict[str, Series]


@dataclass
class Timeline:
    t0: float
    t1: float
    samples: int
    interval_s: float | None
    devices: list[DeviceTimeline]
    torn: int = 0

    def pid_devices(self) -> dict[str, list[str]]:
        """pid -> labels of every GPU it held memory on."""
        out: dict[str, list[str]] = defaultdict(list)
        for d in self.devices:
            for pid in d.processes:
                out[pid].append(d.label)
        return out


def read(path: Path, labels: dict[str, str], buckets: int = BUCKETS) -> Timeline | None:
    """Downsample a timeline file; None when it is missing or has no readable sample."""
    edges = model_timeline.edges(path)
    if edges is None:
        return None
    t0, t1 = edges
    scale = (buckets - 1) / (t1 - t0)
    devices: dict[str, DeviceTimeline] = {}
    samples = torn = 0
    for sample in model_timeline.samples(path):
        if sample is None or not t0 <= sample.t <= t1:  # torn, or out of order
            torn += 1
            continue
        b = min(buckets - 1, max(0, int((sample.t - t0) * scale)))
        for row in sample.devices:  # the hot loop of an hour-long timeline: kept inline
            dev = devices.get(row.uuid)
            if dev is None:
                index = len(devices) if row.nvml_index is None else row.nvml_index
                label = labels.get(row.uuid, f"GPU {index} (not targeted)")
                dev = devices[row.uuid] = DeviceTimeline(row.uuid, index, label, Series("used"), {})
            if row.used is not None and row.used > dev.used.values.get(b, -1):
                dev.used.values[b] = row.used
            for pid, used in (row.processes or {}).items():
                series = dev.processes.get(pid)
                if series is None:
                    series = dev.processes[pid] = Series(pid)
                if (used or 0) > series.values.get(b, -1):
                    series.values[b] = used or 0
        samples += 1
    ordered = sorted(devices.values(), key=lambda d: d.nvml_index)
    interval = (t1 - t0) / (samples - 1) if samples > 1 else None
    return Timeline(t0, t1, samples, interval, ordered, torn)
