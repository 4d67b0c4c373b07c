#!/usr/bin/env bash
# Hardware counters of the SSIM kernels in one training step (forward, backward, scale) and
# one inference call (float32, or $DTYPE), on the lent GPU machine (after the extension is built, e.g. by
# `tools/gpu install`). Usage: bash benchmarks/ssim_ncu.sh [BxCxHxW] (default 5x3x1080x1920).
# Writes $OUT/ncu-<dtype>.txt (or under ./ssim-gpu-logs).
set -o pipefail
out=${OUT:-ssim-gpu-logs}
mkdir -p "$out"
shape=${1:-5x3x1080x1920}
metrics=gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread
metrics+=,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
metrics+=,sm__warps_active.avg.per_cycle_active,smsp__issue_active.avg.pct_of_peak_sustained_active
metrics+=,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg
for r in wait selected no_instruction long_scoreboard not_selected short_scoreboard barrier \
    math_pipe_throttle mio_throttle lg_throttle dispatch_stall branch_resolving; do
  metrics+=,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
ncu --clock-control none --kernel-name regex:ssim_ --metrics "$metrics" \
  ${PYTHON:-python3} - "$shape" <<'PY' 2>&1 | tee "$out/ncu-${DTYPE:-float32}.txt" | grep -v "^==PROF==" | tail -120
import os
import sys

import torch

from gpucheck.kernels.ssim.op import ssim

shape = tuple(int(v) for v in sys.argv[1].split("x"))
dtype = getattr(torch, os.environ.get("DTYPE", "float32"))
x = torch.rand(shape, device="cuda")
y = (0.7 * x + 0.3 * torch.rand(shape, device="cuda")).clamp(0, 1).to(dtype)
x = x.to(dtype)
a = x.clone().requires_grad_(True)
(1 - ssim(a, y)).backward()
ssim(x, y, train=False)
torch.cuda.synchronize()
PY
