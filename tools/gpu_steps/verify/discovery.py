"""GPU verification of device discovery. Run on a machine with >= 2 GPUs:

    python tools/gpu_steps/verify/discovery.py OUT_DIR  (`tools/gpu discovery`)

Checks, each printed as PASS/FAIL with the evidence, full outputs saved under OUT_DIR:
1. `gpucheck devices --json` lists every GPU with UUID, peer matrix and process table;
2. discovery creates no CUDA context (NVML shows no context of this process, and the driver
   probe reports no primary context active) and does not import torch;
3. a helper process that allocates on cuda:0 shows up under device 0 only;
4. CUDA_VISIBLE_DEVICES=1 (and =<UUID of NVML device 1>) maps CUDA 0 to NVML index 1;
5. `gpucheck run --all-devices` on a tiny GPU suite: one worker per device, the other device
   current during each case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "verify-out")
OUT.mkdir(parents=True, exist_ok=True)
results: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, evidence: str) -> None:
    results.append((name, ok, evidence))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {evidence}", flush=True)


def devices_json(env: dict[str, str] | None = None, tag: str = "default") -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "gpucheck.cli", "devices", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )
    (OUT / f"devices_{tag}.json").write_text(proc.stdout + proc.stderr)
    return json.loads(proc.stdout)


# 1. full inventory
inv = devices_json()
devs = inv["devices"]
check(
    "devices listed",
    len(devs) >= 2 and all(d["uuid"].startswith("GPU-") for d in devs),
    f"{len(devs)} devices: "
    + ", ".join(
        f"cuda:{d['cuda_index']}->nvml:{d['nvml_index']} {d['name']} {d['uuid']}" for d in devs
    ),
)
check(
    "peer matrix",
    all(len(d["peer_access"]) == len(devs) for d in devs),
    str([d["peer_access"] for d in devs]),
)
check(
    "versions",
    bool(inv["driver_version"] and inv["cuda_driver_version"]),
    f"driver {inv['driver_version']} cuda {inv['cuda_driver_version']} "
    f"torch {inv['torch_version']} mapping {inv['mapping']}",
)

# 2. no context from discovery, in this process or the probe
from gpucheck import devices, nvml  # noqa: E402

inv2 = devices.discover()
mine = [(d.cuda_index, p.pid) for d in inv2.devices for p in d.processes if p.pid == os.getpid()]
probe = devices.run_cuda_probe()
active = [d["cuda_index"] for d in probe.get("devices", []) if d["primary_context_active"]]
check(
    "no context created",
    not mine and not active and "torch" not in sys.modules,
    f"NVML contexts of this pid: {mine}; primary contexts active in probe: {active}; "
    f"torch imported: {'torch' in sys.modules}",
)

# 3. helper on cuda:0 shows under device 0 only
helper = subprocess.Popen(
    [
        sys.executable,
        "-c",
        textwrap.dedent("""
    import sys, time, torch
    x = torch.ones(64 << 20, device="cuda:0")  # 256 MiB
    torch.cuda.synchronize(); print("ready", flush=True); time.sleep(60)
"""),
    ],
    stdout=subprocess.PIPE,
    text=True,
)
assert helper.stdout is not None
helper.stdout.readline()
time.sleep(1.0)
inv3 = devices_json(tag="helper_on_cuda0")
where = {
    d["cuda_index"]: [p for p in d["processes"] if p["pid"] == helper.pid] for d in inv3["devices"]
}
helper.kill()
helper.wait()
check(
    "helper process only on device 0",
    bool(where.get(0)) and not any(where[i] for i in where if i != 0),
    f"helper pid {helper.pid}: " + json.dumps(where),
)

# 4. CUDA_VISIBLE_DEVICES forms
inv4 = devices_json({"CUDA_VISIBLE_DEVICES": "1"}, tag="cvd_1")
check(
    "CUDA_VISIBLE_DEVICES=1",
    [(d["cuda_index"], d["nvml_index"]) for d in inv4["devices"]] == [(0, 1)],
    str([(d["cuda_index"], d["nvml_index"], d["uuid"]) for d in inv4["devices"]]),
)
uuid1 = nvml.uuid(nvml.handle(1))
inv5 = devices_json({"CUDA_VISIBLE_DEVICES": uuid1[:12]}, tag="cvd_uuid")
check(
    "CUDA_VISIBLE_DEVICES=<uuid prefix>",
    [(d["cuda_index"], d["nvml_index"]) for d in inv5["devices"]] == [(0, 1)],
    f"{uuid1[:12]} -> " + str([(d["cuda_index"], d["nvml_index"]) for d in inv5["devices"]]),
)
inv6 = devices_json({"CUDA_VISIBLE_DEVICES": "1,0"}, tag="cvd_10")
check(
    "CUDA_VISIBLE_DEVICES=1,0",
    [(d["cuda_index"], d["nvml_index"]) for d in inv6["devices"]] == [(0, 1), (1, 0)],
    str([(d["cuda_index"], d["nvml_index"]) for d in inv6["devices"]]),
)

# 5. the harness on a tiny GPU suite
suite = OUT / "demo_suite"
suite.mkdir(exist_ok=True)
(suite / "test_gpu_demo.py").write_text(
    textwrap.dedent("""
    import pytest, torch

    @pytest.mark.gpu
    def test_add(gpu_device, other_device):
        x = torch.arange(1000, device=gpu_device, dtype=torch.float32)
        assert torch.equal((x + 1).cpu(), torch.arange(1, 1001, dtype=torch.float32))
        if other_device is not None:
            assert torch.cuda.current_device() == other_device.index
""")
)
proc = subprocess.run(
    [
        sys.executable,
        "-m",
        "gpucheck.cli",
        "run",
        "--all-devices",
        "--quiet",
        "--suite",
        str(suite),
        "--out",
        str(OUT / "run"),
    ],
    capture_output=True,
    text=True,
    timeout=300,
)
(OUT / "run.log").write_text(proc.stdout + proc.stderr)
recs = [json.loads(line) for line in (OUT / "run" / "results.jsonl").read_text().splitlines()]
cases = [(r["device"], r["status"], r["current_device"]) for r in recs if r["record"] == "case"]
check(
    "gpucheck run --all-devices",
    proc.returncode == 0 and len(cases) == len(devs) and all(s == "passed" for _, s, _ in cases),
    f"exit {proc.returncode}; {cases}",
)

print("\nsummary")
for name, ok, _ in results:
    print(f"  {'PASS' if ok else 'FAIL'}  {name}")
sys.exit(0 if all(ok for _, ok, _ in results) else 1)
