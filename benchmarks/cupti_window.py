"""What a launch-trace window costs, and what every CUDA launch costs after the first one.

    python benchmarks/cupti_window.py OUT_DIR [--windows N]

The launch trace (``gpucheck/detectors/launch_trace.py``) records the launches made during an
extension-op call in a window opened before it and closed right after, with one of two
recorders: a kineto profiler window (CUDA activity only; the default) or CUPTI's callback API
(``gpucheck/detectors/launch_callbacks.py``, ``GPUCHECK_LAUNCH_TRACE=callbacks``). This
measures each, in a fresh process per setting (kineto reads its settings once, at its first
use):

- one window by phase, median over ``--windows`` windows (the first one apart: CUPTI's own
  start): ``open`` (kineto: ``_prepare_profiler`` + ``_enable_profiler``; callbacks:
  subscribe), ``work`` (a marker, a small kernel, a marker), ``close`` (kineto:
  ``synchronize`` + ``_disable_profiler``; callbacks: unsubscribe), ``read`` (the GPU events
  or the records read back); and what each window recorded (a window that loses its events
  does not trace);
- what a CUDA launch costs before any window and after the windows (host microseconds per
  ``torch.add`` of 4,096 floats, median of 5 x 2,000), and a case-sized piece of GPU work
  (pairwise distances and top-4 of 100,000 points, CUDA events, median of 5) before and
  after: what the recorder costs the rest of the process.

Settings: ``CUDA_LAUNCH_BLOCKING`` 1 (how gpucheck runs a case) and 0, each with kineto under
``TEARDOWN_CUPTI`` unset (torch's default), 0 and 1, and with the callback recorder. Writes
OUT_DIR/cupti_window.json and prints a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

#: (CUDA_LAUNCH_BLOCKING, recorder, TEARDOWN_CUPTI)
SETTINGS = [
    (clb, recorder, teardown)
    for clb in ("1", "0")
    for recorder, teardown in (
        ("kineto", None),
        ("kineto", "0"),
        ("kineto", "1"),
        ("callbacks", None),
    )
]
PHASES = ("open", "work", "close", "read", "total")


def launch_us(x: Any, n: int = 2000) -> float:
    """Host microseconds a launch of a small kernel (``torch.add`` on ``x``), ``n`` in a row
    between two synchronizations (``tools/gpu launch-callbacks`` measures with it too)."""
    import torch

    torch.cuda.synchronize(x.device)
    t = time.perf_counter()
    for _ in range(n):
        torch.add(x, 1.0)
    torch.cuda.synchronize(x.device)
    return (time.perf_counter() - t) / n * 1e6


def child(windows: int, recorder: str) -> dict[str, Any]:
    """The measurements in this process (its environment is the setting)."""
    import torch
    from torch._C._profiler import (
        ProfilerActivity,
        ProfilerConfig,
        ProfilerState,
        _ExperimentalConfig,
    )
    from torch.autograd import DeviceType
    from torch.autograd.profiler import _disable_profiler, _enable_profiler, _prepare_profiler

    from gpucheck.detectors import launch_callbacks

    dev = torch.device("cuda", 0)
    x = torch.randn(4096, device=dev)
    points = torch.randn(100_000, 3, device=dev)

    def work_ms() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(0, points.shape[0], 20_000):
            torch.cdist(points[i : i + 20_000], points).topk(4, largest=False)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    config = ProfilerConfig(
        ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig()
    )
    callbacks = launch_callbacks.recorder() if recorder == "callbacks" else None
    if recorder == "callbacks" and callbacks is None:
        raise SystemExit(f"no callback recorder: {launch_callbacks.why_not}")

    def marker() -> None:
        if callbacks is not None:
            callbacks.mark()
        else:
            torch.cuda._sleep(0)

    def open_window() -> None:
        if callbacks is not None:
            if callbacks.open() != 0:
                raise SystemExit("the callback recorder did not open (CUPTI held?)")
        else:
            _prepare_profiler(config, {ProfilerActivity.CUDA})
            _enable_profiler(config, {ProfilerActivity.CUDA})

    def close_window() -> Any:
        if callbacks is not None:
            callbacks.close()
            return None
        torch.cuda.synchronize(dev)
        return _disable_profiler()

    def read(result: Any) -> int:
        if callbacks is not None:
            return len(callbacks.take())
        return sum(e.device_type() == DeviceType.CUDA for e in result.events())

    work_ms()  # warm-up: cuBLAS, the caching allocator
    launch_us(x, 200)
    before = ([launch_us(x) for _ in range(5)], [work_ms() for _ in range(5)])
    phases: dict[str, list[float]] = {k: [] for k in PHASES}
    recorded: list[int] = []
    for _ in range(windows):
        t0 = time.perf_counter()
        open_window()
        t1 = time.perf_counter()
        marker()
        torch.add(x, 1.0)
        marker()
        t2 = time.perf_counter()
        result = close_window()
        t3 = time.perf_counter()
        recorded.append(read(result))
        t4 = time.perf_counter()
        stamps = (t0, t1, t2, t3, t4)
        for k, (a, b) in zip(PHASES[:-1], itertools.pairwise(stamps), strict=True):
            phases[k].append((b - a) * 1e3)
        phases["total"].append((t4 - t0) * 1e3)
    after = ([launch_us(x) for _ in range(5)], [work_ms() for _ in range(5)])
    return {
        "first_window_ms": {k: v[0] for k, v in phases.items()},
        "window_ms": {k: statistics.median(v[1:]) for k, v in phases.items()},
        "recorded_per_window": {"first": recorded[0], "min_after_first": min(recorded[1:])},
        "launch_us": {"before": statistics.median(before[0]), "after": statistics.median(after[0])},
        "work_ms": {"before": statistics.median(before[1]), "after": statistics.median(after[1])},
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--windows", type=int, default=50)
    ap.add_argument("--child", choices=("kineto", "callbacks"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.windows < 2:
        ap.error("--windows: at least 2 (the first one is CUPTI's start, reported apart)")
    if args.child:
        print(json.dumps(child(args.windows, args.child)))
        return 0
    if args.out is None:
        ap.error("OUT_DIR is required")
    import torch

    if not torch.cuda.is_available():
        sys.exit("cupti_window: no CUDA device visible (this measures the profiler on a GPU)")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for clb, recorder, teardown in SETTINGS:
        env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
        env["CUDA_LAUNCH_BLOCKING"] = clb
        env["GPUCHECK_LAUNCH_TRACE"] = recorder
        if teardown is not None:
            env["TEARDOWN_CUPTI"] = teardown
        cmd = [sys.executable, __file__, "--child", recorder, "--windows", str(args.windows)]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            sys.exit(f"cupti_window: the measuring process took over 300 s ({recorder}, CLB={clb})")
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            sys.exit(f"cupti_window: the measuring process failed (exit {done.returncode})")
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(
            {
                "cuda_launch_blocking": clb,
                "recorder": recorder,
                "teardown_cupti": teardown,
                **measured,
            }
        )
    result = {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "windows": args.windows,
        "settings": rows,
    }
    (args.out / "cupti_window.json").write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0


def table(result: dict[str, Any]) -> str:
    lines = [
        f"\n{result['device']}, torch {result['torch']}, {result['windows']} windows a setting",
        "",
        "| CLB | recorder | window ms (open / work / close / read) | recorded a window "
        "(first / later) | launch us before -> after | work ms before -> after |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["settings"]:
        w, e, lu, wk = r["window_ms"], r["recorded_per_window"], r["launch_us"], r["work_ms"]
        recorder = r["recorder"]
        if recorder == "kineto":
            recorder += f", TEARDOWN_CUPTI {r['teardown_cupti'] or 'unset'}"
        lines.append(
            f"| {r['cuda_launch_blocking']} | {recorder} | {w['total']:.2f} ({w['open']:.2f} / "
            f"{w['work']:.2f} / {w['close']:.2f} / {w['read']:.2f}) | "
            f"{e['first']} / {e['min_after_first']} | "
            f"{lu['before']:.2f} -> {lu['after']:.2f} | {wk['before']:.2f} -> {wk['after']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
