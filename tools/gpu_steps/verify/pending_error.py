"""GPU verification of the ``pending-error`` detector (gpucheck/detectors/device_state.py):

    python tools/gpu_steps/verify/pending_error.py OUT_DIR  (`tools/gpu pending-error`)

A suite whose cases leave a real CUDA error pending the way an extension does when its own
check throws without reading the error (or a call goes unchecked): ``cudaHostRegister`` of a
null pointer, an invalid-value error that does not spoil the context, which the runtime keeps
until something reads it. Checks, each printed as PASS/FAIL with the evidence:
1. without gpucheck's detectors (pytest, ``GPUCHECK_DISABLE_DETECTORS=all``) the error is
   really pending: the test after the one that left it fails with it at its first launch
   (what the detector prevents);
2. ``gpucheck run``, with the callback recorder and with kineto's: the case that left it has a
   ``cuda-error`` finding (read after its body), the case after it passes with no finding,
   and a passing case with an unchecked failed call gets the finding too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "verify-out").resolve()
SUITE = OUT / "suite"
SUITE.mkdir(parents=True, exist_ok=True)
(SUITE / "test_pending.py").write_text(
    '''import torch


def leave_pending():
    """A failed CUDA call that nothing reads: the runtime keeps its error for the next launch."""
    return int(torch.cuda.cudart().cudaHostRegister(0, 0, 0))


def test_1_throws(gpu_device):
    torch.ones(4, device=gpu_device).sum().item()
    err = leave_pending()
    assert err != 0, "cudaHostRegister(nullptr) succeeded: nothing is pending"
    raise RuntimeError(f"ext::op: cudaHostRegister failed (error {err})")  # its own check


def test_2_after(gpu_device):
    assert torch.ones(4, device=gpu_device).sum().item() == 4


def test_3_unchecked(gpu_device):
    assert torch.ones(4, device=gpu_device).sum().item() == 4
    leave_pending()


def test_4_after(gpu_device):
    assert torch.ones(4, device=gpu_device).sum().item() == 4
'''
)
results: list[tuple[str, bool]] = []


def check(name: str, ok: bool, evidence: str) -> None:
    results.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {evidence}", flush=True)


def run(cmd: list[str], log: Path, **env: str) -> int:
    with log.open("w") as f:
        proc = subprocess.run(
            cmd,
            cwd=SUITE,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            timeout=300,
        )
    return proc.returncode


# 1. the error is really pending without the detectors
log = OUT / "plain.log"
rc = run(
    [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "test_pending.py"],
    log,
    GPUCHECK_DISABLE_DETECTORS="all",
)
text = log.read_text()
lines = [ln for ln in text.splitlines() if ln.startswith(("PASSED", "FAILED", "ERROR"))]
check(
    "without the detectors the next test fails with the pending error",
    "FAILED test_pending.py::test_2_after" in text and "CUDA error: invalid argument" in text,
    f"rc={rc}; " + " | ".join(ln[:110] for ln in lines),
)


def read_cases(path: Path) -> dict[str, dict]:
    """The suite's case records by test name (test_1 .. test_4)."""
    cases: dict[str, dict] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        r = json.loads(line)
        if r.get("record") == "case":
            for name in ("test_1", "test_2", "test_3", "test_4"):
                if name in r.get("case", ""):
                    cases[name] = r
    return cases


def pending(cases: dict[str, dict], name: str) -> list[dict]:
    return [f for f in cases.get(name, {}).get("findings", []) if f["kind"] == "cuda-error"]


def clean_pass(cases: dict[str, dict], name: str) -> bool:
    r = cases.get(name, {})
    return r.get("status") == "passed" and not r.get("findings")


def said(cases: dict[str, dict], name: str) -> str:
    r = cases.get(name, {})
    found = [(f["kind"], f["message"][:80]) for f in r.get("findings", [])]
    return f"{name} {r.get('status')} {found}"


# 2. gpucheck run, each recorder
for recorder in ("callbacks", "kineto"):
    folder = OUT / f"run-{recorder}"
    cmd = [
        sys.executable,
        "-m",
        "gpucheck.cli",
        "run",
        "--device",
        "0",
        "--suite",
        "test_pending.py",
        "--quiet",
        "--out",
        str(folder),
    ]
    rc = run(cmd, OUT / f"run-{recorder}.log", GPUCHECK_LAUNCH_TRACE=recorder)
    cases = read_cases(folder / "results.jsonl")
    check(
        f"{recorder}: the case that left it has the finding, the next passes clean",
        cases.get("test_1", {}).get("status") == "failed"
        and len(pending(cases, "test_1")) == 1
        and clean_pass(cases, "test_2"),
        f"rc={rc}; {said(cases, 'test_1')}; {said(cases, 'test_2')}",
    )
    check(
        f"{recorder}: a passing case with an unchecked failed call has it too",
        len(pending(cases, "test_3")) == 1
        and pending(cases, "test_3")[0]["severity"] == "error"
        and clean_pass(cases, "test_4"),
        f"{said(cases, 'test_3')}; {said(cases, 'test_4')}",
    )

failed = [name for name, ok in results if not ok]
print(f"{len(results) - len(failed)} of {len(results)} PASS", flush=True)
sys.exit(1 if failed else 0)
