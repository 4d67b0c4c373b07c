#!/usr/bin/env bash
# every bundled suite (ssim knn splat reference checkpoints; SUITES= to choose) on every GPU, detectors on, then the dist suite on NCCL
# Correct kernels must draw no finding. PYTEST_ARGS: after `--` (e.g. -m "not slow").
sargs=(); for x in ${SUITES:-ssim knn splat reference checkpoints}; do sargs+=(--suite "$x"); done
t0=$SECONDS
# shellcheck disable=SC2086  # PYTEST_ARGS is split on purpose
timeout -k 30 "$STEP_TIMEOUT" "$PY" -m gpucheck.cli run "${ALL[@]}" --quiet "${sargs[@]}" \
  --out "$S/suites" -- ${PYTEST_ARGS:-} >"$S/suites.log" 2>&1
rc=$?
tail -2 "$S/suites.log"
tables counts "$S/suites" | tee "$S/suites.txt"
note "suites ${SUITES:-ssim knn splat reference checkpoints} ${ALL[*]}: rc=$rc (0: no finding) in $((SECONDS - t0)) s: $(tail -1 "$S/suites.txt")"
t0=$SECONDS
timeout -k 30 240 "$PY" -m gpucheck.cli run "${ALL[@]}" --quiet --distributed --suite dist \
  --timeout 120 --out "$S/dist" >"$S/dist.log" 2>&1
rc2=$?
tables counts "$S/dist" | tee "$S/dist.txt"
note "suite dist (NCCL, one rank per GPU): rc=$rc2 in $((SECONDS - t0)) s: $(tail -1 "$S/dist.txt")"
exit $(( rc || rc2 ))
