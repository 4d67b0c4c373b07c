"""The report's memory plots: one inline SVG per GPU, drawn from the run's downsampled NVML
timeline (:mod:`.timeline`) and its case records.

A process seen on more than one GPU is flagged: a worker is started for one device, so a
second GPU in its list is a stray context — unless the harness put it there: a worker of a
pass with another device current holds a context on that device by design (the poisoned
device). Workers are known by the pid in their state files (``RunData.states``); an unknown
process on two GPUs is always flagged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpucheck.model.layout import device_in_stem, mode_in_stem, parse_stem
from gpucheck.model.results import BAD_STATUSES
from gpucheck.report.rundata import RunData, case_span
from gpucheck.report.timeline import BUCKETS, DeviceTimeline, Series, Timeline

WIDTH, HEIGHT = 1000.0, 200.0
LEFT, RIGHT, TOP, BOTTOM = 58.0, 8.0, 10.0, 22.0
#: case boundaries are drawn for every case up to this many per device; above, only the
#: cases that did not pass (the rest would be a grey smear)
MAX_BOUNDARIES = 400
GIB = 1024**3
#: process colours (no grey: the GPU's total is the grey line)
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#d62728",
    "#393b79",
)


def _fmt_gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB" if value >= GIB / 100 else f"{value / 2**20:.0f} MiB"


def _fmt_t(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _polylines(series: Series, x: Any, y: Any) -> list[str]:
    """SVG ``points`` strings, one per run of consecutive buckets where the series exists."""
    lines: list[str] = []
    current: list[str] = []
    prev = None
    for b in sorted(series.values):
        if prev is not None and b != prev + 1:
            lines.append(" ".join(current))
            current = []
        current.append(f"{x(b):.1f},{y(series.values[b]):.1f}")
        prev = b
    if current:
        if len(current) == 1 and prev is not None:  # a single bucket: a visible step
            current.append(f"{x(prev) + 2:.1f},{current[0].split(',')[1]}")
        lines.append(" ".join(current))
    return lines


def expected_devices(data: RunData) -> dict[int, set[str]]:
    """pid -> the GPUs the harness meant that worker to touch: its target and, in a pass with
    another device current, that device (from the state files and the case records)."""
    current: dict[tuple[str, str], set[str]] = {}
    for r in data.cases:
        if r.current_device:
            key = (device_in_stem(r.device), mode_in_stem(r.mode))
            current.setdefault(key, set()).add(r.current_device)
    out: dict[int, set[str]] = {}
    for stem, state in data.states.items():
        if state.pid is None:
            continue
        device, mode, _ = parse_stem(stem)
        label = f"cuda:{device.removeprefix('cuda')}" if device.startswith("cuda") else device
        out[state.pid] = {label, *current.get((device, mode), set())}
    return out


def _process_lines(
    dev: DeviceTimeline,
    pid_devices: dict[str, list[str]],
    meant: dict[int, set[str]],
    colours: dict[str, str],
    x: Callable[[float], float],
    y: Callable[[float], float],
) -> list[dict[str, Any]]:
    """One line per process that held memory on the GPU ``dev``: where else it held memory,
    and on which of those GPUs the harness did not mean it to (a stray context)."""
    lines = []
    for pid, series in sorted(dev.processes.items()):
        others = [lab for lab in pid_devices[pid] if lab != dev.label]
        mine = meant.get(int(pid) if pid.isdigit() else -1, set())
        lines.append(
            {
                "pid": pid,
                "colour": colours[pid],
                "peak": _fmt_gib(series.peak),
                "points": _polylines(series, x, y),
                "others": others,
                "stray": [lab for lab in others if lab not in mine],
            }
        )
    return lines


def _case_marks(
    data: RunData, dev: DeviceTimeline, timeline: Timeline, tx: Callable[[float], float]
) -> tuple[list[dict[str, Any]], str]:
    """The marks of the cases that ran on ``dev`` along the bottom of its plot (only those
    that did not pass where there are too many), and a note when some are left out."""
    cases = [r for r in data.cases if r.device == dev.label]
    bad = [r for r in cases if r.status in BAD_STATUSES]
    shown = cases if len(cases) <= MAX_BOUNDARIES else bad
    marks = []
    for r in shown:
        s = case_span(r)
        if s is None or s[1] < timeline.t0 or s[0] > timeline.t1:
            continue
        marks.append(
            {
                "x": round(tx(s[0]), 1),
                "w": round(max(0.6, tx(s[1]) - tx(s[0])), 1),
                "status": r.status,
                "title": f"{r.status}: {r.case} ({r.mode}, {r.duration_s:.2f} s)",
            }
        )
    note = (
        ""
        if shown is cases
        else f"{len(cases)} cases: only the {len(bad)} that did not pass are marked"
    )
    return marks, note


def plots(data: RunData, buckets: int = BUCKETS) -> list[dict[str, Any]]:
    """Geometry of one plot per GPU of the run's timeline, for the template (none without
    a timeline)."""
    timeline = data.timeline
    if timeline is None:
        return []
    span = timeline.t1 - timeline.t0
    meant = expected_devices(data)
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    pid_devices = timeline.pid_devices()
    colours = {pid: PALETTE[i % len(PALETTE)] for i, pid in enumerate(sorted(pid_devices))}
    out = []
    for dev in timeline.devices:
        highest = max([dev.used.peak, *(s.peak for s in dev.processes.values())], default=0)
        top = max(highest * 1.08, GIB / 4)

        def x(b: float) -> float:
            return LEFT + pw * b / (buckets - 1)

        def y(v: float, top: float = top) -> float:
            return TOP + ph * (1 - v / top)

        def tx(t: float) -> float:
            return LEFT + pw * min(1.0, max(0.0, (t - timeline.t0) / span))

        lines = _process_lines(dev, pid_devices, meant, colours, x, y)
        marks, marks_note = _case_marks(data, dev, timeline, tx)
        yticks = [
            {"y": round(y(top * f / 1.08), 1), "label": _fmt_gib(top * f / 1.08)}
            for f in (0.0, 0.5, 1.0)
        ]
        xticks = [
            {"x": round(LEFT + pw * f, 1), "label": _fmt_t(span * f)}
            for f in (0.0, 0.25, 0.5, 0.75, 1.0)
        ]
        out.append(
            {
                "label": dev.label,
                "uuid": dev.uuid,
                "nvml_index": dev.nvml_index,
                "targeted": dev.label in data.devices,
                "used_points": _polylines(dev.used, x, y),
                "used_peak": _fmt_gib(dev.used.peak),
                "lines": lines,
                "marks": marks,
                "yticks": yticks,
                "xticks": xticks,
                "marks_note": marks_note,
                "stray": any(line["stray"] for line in lines),
                "width": WIDTH,
                "height": HEIGHT,
                "left": LEFT,
                "right": WIDTH - RIGHT,
                "top": TOP,
                "bottom": HEIGHT - BOTTOM,
            }
        )
    return out
