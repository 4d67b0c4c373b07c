"""Probes for the distributed watchdog on this machine (one process, world size 1, NCCL; the
`probes` part of the `dist` step of tools/gpu):

1. the NCCL flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE) records our collectives with their
   sequence numbers, and gpucheck reads its dump (``_dump_nccl_trace``) as the watchdog does;
2. TORCH_DISTRIBUTED_DEBUG=DETAIL with DistributedDataParallel (torch 2.13's CPU build
   segfaults in DDP's constructor under DETAIL with gloo), in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

DDP_DETAIL = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
m = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[0])
m(torch.randn(2, 4, device="cuda")).sum().backward()
torch.cuda.synchronize()
print("DDP under DETAIL: ok")
dist.destroy_process_group()
"""


def main() -> int:
    from gpucheck.controller.dist_group import free_port

    env = {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    os.environ.update(env, MASTER_PORT=str(free_port()), TORCH_NCCL_TRACE_BUFFER_SIZE="100")
    import torch
    import torch.distributed as dist

    from gpucheck.distributed.rank import read_trace

    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    t = torch.ones(1000, device="cuda")
    for _ in range(3):
        dist.all_reduce(t)
    dist.all_gather_into_tensor(torch.empty(1000, device="cuda"), t)
    torch.cuda.synchronize()
    dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
    if dump is None:
        print("flight recorder: torch has no _dump_nccl_trace")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.pkl"
            path.write_bytes(dump())
            entries = read_trace(path)
        print(f"flight recorder: {len(entries)} entries")
        for e in entries[-5:]:
            print(f"  #{e['seq']} {e['op']} {e['state']} {e['input_sizes']}")
    dist.destroy_process_group()
    child = subprocess.run(
        [sys.executable, "-c", DDP_DETAIL],
        capture_output=True,
        text=True,
        timeout=90,
        env={
            **os.environ,
            **env,
            "MASTER_PORT": str(free_port()),
            "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        },
    )
    print(
        f"DDP under TORCH_DISTRIBUTED_DEBUG=DETAIL: exit {child.returncode}",
        (child.stdout + child.stderr).strip().splitlines()[-1:] or "",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
