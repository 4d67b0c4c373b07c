#!/usr/bin/env bash
# benchmarks/fingerprint_cost.py: what the numerics detector's fingerprint of one op call costs, under CUDA_LAUNCH_BLOCKING=1 (as in gpucheck run) and without
rc=0
for clb in 1 0; do
  CUDA_LAUNCH_BLOCKING=$clb timeout -k 30 "$STEP_TIMEOUT" "$PY" benchmarks/fingerprint_cost.py \
    --json "$S/fingerprint_cost_clb$clb.json" >"$S/fingerprint_cost_clb$clb.log" 2>&1 || rc=$?
  tail -10 "$S/fingerprint_cost_clb$clb.log"
done
note "fingerprint_cost: rc=$rc"
exit "$rc"
