#!/usr/bin/env bash
# the kernel suites (ssim knn splat; SUITES=) on every GPU under compute-sanitizer memcheck: no sanitizer record
sargs=(); for x in ${SUITES:-ssim knn splat}; do sargs+=(--suite "$x"); done
t0=$SECONDS
timeout -k 30 "$STEP_TIMEOUT" "$PY" -m gpucheck.cli run "${ALL[@]}" --quiet "${sargs[@]}" \
  --mode sanitizer:memcheck --timeout 300 --out "$S/run" >"$S/memcheck.log" 2>&1
rc=$?
tail -3 "$S/memcheck.log"
tables counts "$S/run" | tee "$S/counts.txt"
note "memcheck ${SUITES:-ssim knn splat}: rc=$rc in $((SECONDS - t0)) s: $(tail -1 "$S/counts.txt")"
exit "$rc"
