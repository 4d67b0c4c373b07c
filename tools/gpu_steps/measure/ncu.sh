#!/usr/bin/env bash
# Nsight Compute counters and stall reasons of the SSIM kernels of one training step and one inference call
# benchmarks/ssim_ncu.sh (NCU_SHAPE, default 5x3x1080x1920; DTYPE, default float32), after install.
OUT=$S bash benchmarks/ssim_ncu.sh "${NCU_SHAPE:-5x3x1080x1920}" >"$S/ncu.log" 2>&1
rc=$?
tail -60 "$S/ncu.log"
note "ncu ssim ${NCU_SHAPE:-5x3x1080x1920} ${DTYPE:-float32}: rc=$rc (counters: $S/ncu-${DTYPE:-float32}.txt)"
exit "$rc"
