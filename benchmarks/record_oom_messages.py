"""Record real CUDA out-of-memory messages of this machine's torch, on purpose, for the
oom-anomaly parser's fixtures (tests/fixtures/oom/).

Each kind runs in its own child process (the allocator settings differ, and a process that hit
an OOM keeps its cache): a single request larger than the whole device; fragmentation (holes in
a reserved segment, so "reserved by PyTorch but unallocated" is large); a per-process memory
cap (``set_per_process_memory_fraction``); the same huge request with
``expandable_segments:True`` and with caching off (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``); an
OOM on a device other than 0 when there is one. Writes ``<out>/<kind>.txt`` (the exception's
``str``), ``<out>/<kind>.traceback.txt`` and ``<out>/meta.json`` (torch, driver, device).

    python benchmarks/record_oom_messages.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import sys, traceback, torch
kind, out, dev = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.cuda.set_device(dev)
GiB = 1 << 30
total = torch.cuda.get_device_properties(dev).total_memory
keep = []
try:
    if kind in ("huge_request", "huge_request_expandable", "huge_request_no_caching",
                "huge_request_other_device"):
        keep.append(torch.ones(256 << 20, dtype=torch.uint8, device=dev))  # some footprint
        torch.empty(2 * total, dtype=torch.uint8, device=dev)
    elif kind == "fragmentation":
        torch.cuda.set_per_process_memory_fraction(24 * GiB / total, dev)
        big = torch.empty(16 * GiB, dtype=torch.uint8, device=dev)
        del big  # one cached 16 GiB segment
        parts = [torch.empty(int(1.9 * GiB), dtype=torch.uint8, device=dev) for _ in range(8)]
        keep = parts[::2]
        del parts  # every other block freed: holes of 1.9 GiB inside the segment
        torch.empty(10 * GiB, dtype=torch.uint8, device=dev)
    elif kind == "process_fraction":
        torch.cuda.set_per_process_memory_fraction(4 * GiB / total, dev)
        keep.append(torch.empty(2 * GiB, dtype=torch.uint8, device=dev))
        torch.empty(3 * GiB, dtype=torch.uint8, device=dev)
    elif kind == "many_small_until_full":
        torch.cuda.set_per_process_memory_fraction(3 * GiB / total, dev)
        while True:
            keep.append(torch.empty(64 << 20, dtype=torch.uint8, device=dev))
    print("no OOM", file=sys.stderr)
    sys.exit(3)
except torch.OutOfMemoryError as err:
    open(f"{out}/{kind}.txt", "w").write(str(err))
    open(f"{out}/{kind}.traceback.txt", "w").write(traceback.format_exc())
    open(f"{out}/{kind}.type.txt", "w").write(f"{type(err).__module__}.{type(err).__qualname__}")
"""


def main(out: Path) -> int:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    kinds: list[tuple[str, dict[str, str], int]] = [
        ("huge_request", {}, 0),
        ("fragmentation", {}, 0),
        ("process_fraction", {}, 0),
        ("many_small_until_full", {}, 0),
        ("huge_request_expandable", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, 0),
        ("huge_request_no_caching", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, 0),
    ]
    if torch.cuda.device_count() > 1:
        kinds.append(("huge_request_other_device", {}, 1))
    done = {}
    for kind, env, dev in kinds:
        proc = subprocess.run([sys.executable, "-c", CHILD, kind, str(out), str(dev)],
                              env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=120)
        done[kind] = {"env": env, "device": dev, "returncode": proc.returncode,
                      "stderr_tail": proc.stderr[-500:]}
        print(kind, proc.returncode, proc.stderr[-200:].strip())
    props = torch.cuda.get_device_properties(0)
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "device": props.name, "total_memory": props.total_memory,
            "devices": torch.cuda.device_count(), "kinds": done}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "oom_messages")))
