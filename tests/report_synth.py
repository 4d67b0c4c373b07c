"""A synthetic run folder written with the package's own record writers, at any scale.

Used by the report tests (small) and, run as a script, to measure the report on a large run:

    python tests/report_synth.py OUT_DIR [--devices 8] [--cases 5000] [--hours 1] [--browser]

Cases run back to back on every device over ``hours``; about 1% fail with a CUDA error, some
carry a real compute-sanitizer record (tests/fixtures/sanitizer), one crashes (a fresh worker
pid follows), one hangs; the worker of the last device holds a stray context on GPU 0 for a
while (NVML timeline and the cases' ``nvml_peak_other_devices``).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clirun import gpucheck

from gpucheck.model import results
from gpucheck.model.memory import Memory
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.model.timeline import DeviceRow, TimelineWriter
from gpucheck.sanitizer.findings import sanitizer_findings

HERE = Path(__file__).resolve().parent
SANITIZER_LOG = HERE / "fixtures" / "sanitizer" / "memcheck_unguarded_launch_h200x2.log"
MIB = 2**20
SUITES = ("ssim", "knn", "splat")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


def make_run(
    out: Path,
    devices: int = 2,
    cases: int = 40,
    hours: float = 0.02,
    interval: float = 0.05,
    seed: int = 0,
) -> Path:
    """Write results.jsonl and nvml_timeline.jsonl of a synthetic run into ``out``."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time() - hours * 3600 - 60
    uuids = [f"GPU-{i:08x}-synthetic-{seed}" for i in range(devices)]
    header = {
        "schema": results.SCHEMA_ID,
        "record": "run",
        "run_id": f"synth{seed}",
        "started_at": _iso(t0),
        "gpucheck_version": "0.1.0",
        "torch_version": "2.11.0",
        "driver_version": "580.159.04",
        "devices": [
            {"device": f"cuda:{i}", "uuid": u, "name": "NVIDIA H200"} for i, u in enumerate(uuids)
        ],
        "suites": list(SUITES),
        "modes": ["blocking+nvml"],
        "notes": [],
    }
    sanitizer_text = SANITIZER_LOG.read_text()
    span = hours * 3600
    stray = (devices - 1, span * 0.3, span * 0.55)  # (device, from, to): context on GPU 0
    lines = [json.dumps(header)]
    pids: dict[int, list[tuple[float, int]]] = {}  # device -> [(from, pid)]
    usage: dict[int, list[tuple[float, float, int]]] = {d: [] for d in range(devices)}
    for d in range(devices):
        now = t0 + 1.0
        pid = 1000 + 100 * d
        pids[d] = [(0.0, pid)]
        per = span / cases
        for n in range(cases):
            suite = SUITES[n % len(SUITES)]
            case = f"suites/{suite}/test_{suite}.py::test_case[{n:05d}]"
            duration = per * rng.uniform(0.5, 0.95) * (3.0 if d == 1 and n % 7 == 0 else 1.0)
            duration = min(duration, per * 0.98)
            peak = int(rng.uniform(20, 900) * MIB)
            status, reason, findings = "passed", None, []
            kind = None
            if n % 97 == 13 and d > 0:
                kind = "cuda-error"
            elif n % 211 == 5:
                kind = "sanitizer"
            elif n == cases // 2 and d == 0:
                kind = "crash"
            elif n == cases // 3 and d == devices - 1:
                kind = "hang"
            elif n % 50 == 49:
                status, reason = "skipped", "needs another device current"
            record = CaseRecord(
                run_id=header["run_id"],
                device=f"cuda:{d}",
                suite=suite,
                case=case,
                mode="blocking+nvml",
                status=status,
                reason=reason,
                duration_s=round(duration, 4),
                started_at=_iso(now),
                device_uuid=uuids[d],
                current_device=f"cuda:{(d + 1) % devices}",
            )
            record.memory = Memory(
                torch_peak_allocated=peak,
                torch_peak_reserved=peak + 2 * MIB,
                nvml_peak_used=peak + 520 * MIB,
                nvml_peak_other_devices={},
            )
            if d == stray[0] and stray[1] <= now - t0 <= stray[2] and devices > 1:
                record.memory.nvml_peak_other_devices = {uuids[0]: 530 * MIB}
            if kind == "cuda-error":
                msg = "RuntimeError: CUDA error: an illegal memory access was encountered"
                findings = [
                    Finding(
                        "cuda-error",
                        "error",
                        msg,
                        f"cuda:{d}",
                        suite,
                        case,
                        evidence=f"def test_case():\n>   y = op(x)\nE   {msg}",
                        hint="missing device guard (OptionalCUDAGuard)",
                    )
                ]
                status, reason = "failed", msg
            elif kind == "sanitizer":
                findings = sanitizer_findings(sanitizer_text, "memcheck", f"cuda:{d}", suite, case)
                status, reason = "failed", f"compute-sanitizer: {findings[0].message}"
            elif kind in ("crash", "hang"):
                tail = (
                    "terminate called after throwing an instance of 'thrust::system_error'\n"
                    "  what():  parallel_for failed: cudaErrorIllegalAddress\n--- tail ---\n"
                    'Fatal Python error: Aborted\n  File "' + case + '", line 12'
                )
                if kind == "hang":
                    tail = (
                        "--- Python stacks of every thread when stopped ---\nThread 0x1 "
                        '(most recent call first):\n  File "torch/distributed/'
                        'distributed_c10d.py", line 2501 in all_reduce\n  File "'
                        + case
                        + '", line 40 in test_case\n'
                    )
                status = "crashed" if kind == "crash" else "hung"
                reason = (
                    "worker killed by SIGABRT while running this case"
                    if kind == "crash"
                    else "no progress for 900 s; killed"
                )
                record.signal = "SIGABRT" if kind == "crash" else "SIGKILL"
                record.stderr_tail = tail
                record.started_at = _iso(now + duration)  # the harness stamps the end
                findings = [
                    Finding(
                        kind,
                        "error",
                        reason,
                        f"cuda:{d}",
                        suite,
                        case,
                        evidence=tail,
                        hint="see the stacks",
                    )
                ]
            record.status, record.reason, record.findings = status, reason, findings
            lines.append(json.dumps(record.to_json(), separators=(",", ":")))
            usage[d].append((now - t0, now - t0 + duration, peak))
            now += per
            if kind in ("crash", "hang"):
                pid += 1
                pids[d].append((now - t0, pid))
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    _timeline(out / "nvml_timeline.jsonl", t0, span, interval, uuids, usage, pids, stray)
    return out


def _timeline(
    path: Path,
    t0: float,
    span: float,
    interval: float,
    uuids: list[str],
    usage: dict[int, list[tuple[float, float, int]]],
    pids: dict[int, list[tuple[float, int]]],
    stray: tuple[int, float, float],
) -> None:
    writer = TimelineWriter(path)
    cursor = dict.fromkeys(usage, 0)
    steps = int(span / interval)
    for k in range(steps):
        rel = k * interval
        rows = []
        for d, uuid in enumerate(uuids):
            spans = usage[d]
            i = cursor[d]
            while i + 1 < len(spans) and spans[i][1] < rel:
                i += 1
            cursor[d] = i
            a, b, peak = spans[i]
            mem = 520 * MIB + (peak if a <= rel <= b else 0)
            pid = [p for start, p in pids[d] if start <= rel][-1]
            procs = {str(pid): mem}
            if d == 0 and len(uuids) > 1 and stray[1] <= rel <= stray[2]:
                procs[str([p for s, p in pids[stray[0]] if s <= rel][-1])] = 530 * MIB
            rows.append(DeviceRow(d, uuid, sum(procs.values()) + 300 * MIB, dict(procs)))
        writer(t0 + rel, rows)
    writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--browser", action="store_true", help="also time the page in Chromium")
    args = ap.parse_args()
    t = time.perf_counter()
    make_run(args.out, args.devices, args.cases, args.hours)
    print(f"wrote the run in {time.perf_counter() - t:.1f} s")
    from gpucheck.report import write_all

    t = time.perf_counter()
    paths = write_all(args.out)
    print(
        f"write_all: {time.perf_counter() - t:.2f} s; "
        + ", ".join(f"{p.name} {p.stat().st_size / 1e6:.1f} MB" for p in paths.values())
    )
    if args.browser:
        driver = chrome()
        t = time.perf_counter()
        driver.get(paths["html"].resolve().as_uri())
        nav = driver.execute_script(
            "var n = performance.getEntriesByType('navigation')[0];"
            "return [n.domContentLoadedEventEnd, n.loadEventEnd];"
        )
        print(
            f"Chromium: get() {time.perf_counter() - t:.2f} s, DOMContentLoaded "
            f"{nav[0]:.0f} ms, load {nav[1]:.0f} ms"
        )
        driver.quit()


CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def chrome() -> Any:
    """Headless Chromium with the system's chromedriver (never Selenium Manager's download)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = next(shutil.which(c) for c in CHROMIUM if shutil.which(c))
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--disable-dev-shm-usage",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(
        service=Service(executable_path=shutil.which("chromedriver")), options=opts
    )


def real_cpu_run(base: Path) -> Path:
    """A run of the real harness on CPU of test_harness.py's demo suite (passing, failing,
    skipped, erroring, crashing and hanging cases), made once per ``base`` folder."""

    from demosuite import SUITE

    out = base / "cpu_run"
    if (out / "results.jsonl").exists():
        return out
    suite = base / "cpu_suite" / "demo"
    suite.mkdir(parents=True, exist_ok=True)
    (suite / "test_demo.py").write_text(SUITE)
    gpucheck(
        "run",
        "--cpu-only",
        "--quiet",
        "--suite",
        str(suite),
        "--timeout",
        "2",
        "--out",
        str(out),
        cwd=base,
        timeout=300,
        env={"DEMO_CUDA_ERROR": "1", "DEMO_ABORT": "1", "DEMO_HANG": "1"},
    )
    return out


if __name__ == "__main__":
    main()
