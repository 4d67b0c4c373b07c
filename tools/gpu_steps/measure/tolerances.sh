#!/usr/bin/env bash
# the kernel tests' tolerances measured over fresh seeds (TOL_SECONDS each, 60): benchmarks/tolerances.py (ssim, knn), splat_tolerances.py per dtype
# Each prints a summary table (its share of each bound, or the errors behind the splat bounds)
# and writes every record to $S/*.json; a share near 1 is a flaky test. TOL_DTYPES: the splat
# dtypes (default "float32 bfloat16 float16").
t0=$SECONDS
rc=0
timeout -k 30 "$STEP_TIMEOUT" "$PY" benchmarks/tolerances.py --kernels ssim knn \
  --seconds "${TOL_SECONDS:-60}" --json "$S/ssim_knn.json" >"$S/ssim_knn.log" 2>&1 || rc=1
tail -32 "$S/ssim_knn.log"
for dt in ${TOL_DTYPES:-float32 bfloat16 float16}; do
  timeout -k 30 "$STEP_TIMEOUT" "$PY" benchmarks/splat_tolerances.py --dtype "$dt" \
    --seconds "${TOL_SECONDS:-60}" --json "$S/splat_$dt.json" >"$S/splat_$dt.log" 2>&1 || rc=1
  tail -40 "$S/splat_$dt.log"
done
note "tolerances: ssim, knn and splat (${TOL_DTYPES:-float32 bfloat16 float16}), ${TOL_SECONDS:-60} s each: rc=$rc, $((SECONDS - t0)) s"
exit "$rc"
