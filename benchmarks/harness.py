"""Harness overhead on a multi-GPU machine.

    python benchmarks/harness.py OUT_DIR [--suite NAME ...] [-- PYTEST_ARGS]

Three runs of the same suites: (1) `--device 0` in blocking+nvml, (2) `--all-devices` in
blocking+nvml, (3) `--all-devices` in blocking only. Reports the wall time of each,
(2)/(1) (target <= 1.25: devices run concurrently), the NVML sampling cost (2) vs (3)
(target <= 2 %), and the harness's own time per case: worker start-up (run start to first
case) and the gap between one case's end and the next one's start (hooks, record writing,
making another device current).
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

args = sys.argv[1:]
extra = args[args.index("--") :] if "--" in args else []
args = args[: args.index("--")] if "--" in args else args
OUT = Path(args[0] if args else "harness-bench")
suites = [a for i, a in enumerate(args) if i > 0 and args[i - 1] == "--suite"] or ["knn"]
suite_args = [x for s in suites for x in ("--suite", s)]


def run(tag: str, *opts: str) -> tuple[float, list[dict]]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpucheck.cli",
            "run",
            "--quiet",
            *opts,
            *suite_args,
            "--out",
            str(OUT / tag),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=590,
    )
    wall = time.perf_counter() - t0
    (OUT / f"{tag}.log").write_text(proc.stdout + proc.stderr)
    recs = [json.loads(x) for x in (OUT / tag / "results.jsonl").read_text().splitlines()]
    print(
        f"{tag}: exit {proc.returncode}, {wall:.1f} s, "
        f"{sum(r['record'] == 'case' for r in recs)} records",
        flush=True,
    )
    return wall, recs


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def overheads(recs: list[dict]) -> tuple[float, float, float]:
    """(start-up s, median gap between cases ms, sum of case durations s) over workers."""
    header = recs[0]
    start = ts(header["started_at"])
    startups, gaps, busy = [], [], 0.0
    by_dev: dict[str, list[dict]] = {}
    for r in recs[1:]:
        if r["record"] == "case" and r.get("started_at"):
            by_dev.setdefault(r["device"], []).append(r)
    for cases in by_dev.values():
        cases.sort(key=lambda r: ts(r["started_at"]))
        startups.append(ts(cases[0]["started_at"]) - start)
        for a, b in itertools.pairwise(cases):
            gaps.append(ts(b["started_at"]) - ts(a["started_at"]) - a["duration_s"])
        busy += sum(r["duration_s"] for r in cases)
    return (max(startups), 1000 * statistics.median(gaps) if gaps else 0.0, busy)


OUT.mkdir(parents=True, exist_ok=True)
single, r1 = run("single", "--device", "0", "--mode", "blocking", "--mode", "nvml")
multi, r2 = run("all", "--all-devices", "--mode", "blocking", "--mode", "nvml")
plain, r3 = run("all-no-nvml", "--all-devices", "--mode", "blocking")
startup, gap_ms, busy = overheads(r2)
_, _, busy_plain = overheads(r3)
devices = len({r["device"] for r in r2 if r["record"] == "case"})
cases = sum(r["record"] == "case" for r in r2)
print("\n| measure | value | target |")
print("|---|---|---|")
print(f"| wall, --device 0 (blocking+nvml) | {single:.1f} s | |")
print(f"| wall, --all-devices ({devices} devices, blocking+nvml) | {multi:.1f} s | |")
print(f"| all-devices / single-device | {multi / single:.2f}x | <= 1.25x |")
print(f"| wall, --all-devices without nvml | {plain:.1f} s | |")
print(
    f"| NVML cost on case time (sum of case durations) | "
    f"{100 * (busy - busy_plain) / busy_plain:+.1f} % | <= 2 % |"
)
print(f"| NVML cost on wall time | {100 * (multi - plain) / plain:+.1f} % | |")
print(f"| worker start-up (run start to first case) | {startup:.1f} s | |")
print(f"| harness gap between cases (median) | {gap_ms:.1f} ms | |")
print(f"| cases per run | {cases} | |")
