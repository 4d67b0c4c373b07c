#!/usr/bin/env bash
# device discovery: gpucheck devices, no CUDA context, NVML/CUDA mapping under CUDA_VISIBLE_DEVICES (2+ GPUs)
# tools/gpu_steps/verify/discovery.py prints one PASS/FAIL line per check; its outputs are in $S.
"$PY" "$STEPS_DIR/verify/discovery.py" "$S/out" >"$S/discovery.log" 2>&1
rc=$?
grep -E "^(PASS|FAIL)" "$S/discovery.log"
note "discovery: rc=$rc, $(grep -c '^PASS' "$S/discovery.log") PASS, $(grep -c '^FAIL' "$S/discovery.log") FAIL"
exit "$rc"
