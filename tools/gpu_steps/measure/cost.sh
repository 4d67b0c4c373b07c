#!/usr/bin/env bash
# the detectors' cost: knn + ssim + splat (-m "not slow") with every detector on and off, each setting once on each GPU
# With 2+ GPUs, on@0 with off@1 at once, then swapped; on one GPU the four runs one after another.
cost_run() {  # GPU, label, value of GPUCHECK_DISABLE_DETECTORS
  CUDA_VISIBLE_DEVICES=$1 GPUCHECK_DISABLE_DETECTORS=$3 "$PY" -m gpucheck.cli run --quiet \
    --suite ssim --suite knn --suite splat --out "$S/cost_$2" \
    -- -m "not slow" >"$S/cost_$2.log" 2>&1
}
t0=$SECONDS
if [ "$NGPU" -gt 1 ]; then
  cost_run 0 on_a "" & cost_run 1 off_a all & wait
  cost_run 0 off_b all & cost_run 1 on_b "" & wait
else
  cost_run 0 on_a ""; cost_run 0 off_a all; cost_run 0 off_b all; cost_run 0 on_b ""
fi
tables cost "$S" | tee "$S/cost.txt"
rc=${PIPESTATUS[0]}
note "cost: 4 runs in $((SECONDS - t0)) s: $(tail -1 "$S/cost.txt")"
exit "$rc"
