"""GPU verification of the harness with the deliberately broken extension.

    python tools/gpu_steps/verify/harness_check.py OUT_DIR [--sanitizer]  (`tools/gpu harness`)

Runs `gpucheck run --all-devices --suite selftest` in blocking+nvml (and, with --sanitizer,
sanitizer:memcheck) and checks that every defect is reported as expected while every good
case on every device still runs and passes. Prints PASS/FAIL lines and a summary.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "verify-harness")
SANITIZER = "--sanitizer" in sys.argv
checks: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, evidence: str) -> None:
    checks.append((name, ok, evidence))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {evidence}", flush=True)


modes = ["--mode", "blocking", "--mode", "nvml"]
if SANITIZER:
    modes += ["--mode", "sanitizer:memcheck"]
t0 = time.monotonic()
proc = subprocess.run(
    [
        sys.executable,
        "-m",
        "gpucheck.cli",
        "run",
        "--all-devices",
        "--quiet",
        "--suite",
        "selftest",
        *modes,
        "--timeout",
        "300",
        "--out",
        str(OUT / "run"),
    ],
    capture_output=True,
    text=True,
    timeout=580,
)
(OUT / "run.log").write_text(proc.stdout + proc.stderr)
print(proc.stdout[-3000:])
recs = [json.loads(x) for x in (OUT / "run" / "results.jsonl").read_text().splitlines()]
cases = [r for r in recs if r["record"] == "case"]
devices = sorted({r["device"] for r in cases})
check(
    "run exits 1 (findings)",
    proc.returncode == 1,
    f"exit {proc.returncode} after {time.monotonic() - t0:.0f} s; devices {devices}",
)


def get(mode: str, device: str, name: str) -> dict | None:
    for r in cases:
        if r["mode"] == mode and r["device"] == device and r["case"].endswith(name):
            return r
    return None


for dev in devices:
    tag = dev.replace(":", "")
    m = "blocking+nvml"
    good = [get(m, dev, f"test_good_guarded[{tag}-{i}]") for i in range(3)]
    after = get(m, dev, f"test_good_after_the_defects[{tag}]")
    check(
        f"{dev} good cases pass",
        all(r and r["status"] == "passed" for r in [*good, after]),
        str([r and r["status"] for r in [*good, after]]),
    )
    ung = get(m, dev, f"test_unguarded_launch[{tag}]")
    kinds = [f["kind"] for f in (ung or {}).get("findings", [])]
    check(
        f"{dev} unguarded launch found",
        bool(ung) and ung["status"] == "failed" and "cuda-error" in kinds,
        f"{ung and ung['status']} {kinds} "
        f"{ung and (ung['reason'] or '')[:120]} current={ung and ung['current_device']}",
    )
    ab = get(m, dev, f"test_abort[{tag}]")
    check(
        f"{dev} abort is a crashed record",
        bool(ab)
        and ab["status"] == "crashed"
        and ab["signal"] == "SIGABRT"
        and "terminate called" in (ab["stderr_tail"] or ""),
        f"{ab and ab['status']} {ab and ab['signal']}",
    )
    over = get(m, dev, f"test_overrun[{tag}]")
    check(
        f"{dev} overrun is silent without the sanitizer",
        bool(over) and over["status"] == "passed",
        str(over and over["status"]),
    )
    peak = good[0] and good[0]["memory"].get("nvml_peak_used")
    check(f"{dev} nvml per-case peak recorded", bool(peak), f"{peak}")
    if SANITIZER:
        s = "sanitizer:memcheck"
        over = get(s, dev, f"test_overrun[{tag}]")
        msgs = [f["message"] for f in (over or {}).get("findings", []) if f["kind"] == "sanitizer"]
        check(
            f"{dev} memcheck finds the overrun",
            bool(over)
            and over["status"] in ("failed", "crashed")
            and any("Invalid __global__ write" in x and "add_one" in x for x in msgs),
            f"{over and over['status']} {str(msgs)[:300]}",
        )
        good_s = get(s, dev, f"test_good_guarded[{tag}-0]")
        check(
            f"{dev} good case clean under memcheck",
            bool(good_s) and good_s["status"] == "passed",
            str(good_s and good_s["status"]),
        )
        ung = get(s, dev, f"test_unguarded_launch[{tag}]")
        msgs = [f["message"] for f in (ung or {}).get("findings", []) if f["kind"] == "sanitizer"]
        check(
            f"{dev} unguarded launch found under memcheck",
            bool(ung)
            and ung["status"] in ("failed", "crashed")
            and any("Invalid __global__" in x for x in msgs),
            f"{ung and ung['status']} {str(msgs)[:300]}",
        )
        stray = [
            r["case"]
            for r in cases
            if r["mode"] == s and r["device"] == dev and r["case"].startswith("<")
        ]
        check(f"{dev} every sanitizer record attributed to a case", not stray, str(stray))
timeline = OUT / "run" / "nvml_timeline.jsonl"
check(
    "nvml timeline written",
    timeline.exists() and timeline.stat().st_size > 0,
    f"{len(timeline.read_text().splitlines()) if timeline.exists() else 0} samples",
)
print("\nsummary")
for name, ok, _ in checks:
    print(f"  {'PASS' if ok else 'FAIL'}  {name}")
sys.exit(0 if all(ok for _, ok, _ in checks) else 1)
