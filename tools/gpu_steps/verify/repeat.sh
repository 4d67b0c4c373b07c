#!/usr/bin/env bash
# the kernel suites (ssim knn splat) REPEAT times (5) and the selftest --sanitizer SELFTESTS times (2) on GPU 0: flaky tolerances show as failures
# Each run is a fresh `gpucheck run` (new random inputs where a case draws them); the table:
# one line per run with its counts, the last line the failures over all of them (0 expected).
t0=$SECONDS
fails=0
for i in $(seq "${REPEAT:-5}"); do
  CUDA_VISIBLE_DEVICES=0 timeout -k 30 "$STEP_TIMEOUT" "$PY" -m gpucheck.cli run --quiet \
    --suite ssim --suite knn --suite splat --out "$S/suites_$i" >"$S/suites_$i.log" 2>&1
  rc=$?
  echo "suites run $i: rc=$rc: $(tables counts "$S/suites_$i" | tail -1)"
  [ "$rc" -eq 0 ] || fails=$((fails + 1))
done
for i in $(seq "${SELFTESTS:-2}"); do
  CUDA_VISIBLE_DEVICES=0 timeout -k 30 "$STEP_TIMEOUT" "$PY" -m gpucheck.cli selftest \
    --sanitizer --out "$S/selftest_$i" >"$S/selftest_$i.log" 2>&1
  rc=$?
  echo "selftest run $i: rc=$rc (2: complete but the 2-GPU rows): $(tables matrix "$S/selftest_$i" | tail -1)"
  [ "$rc" -eq 2 ] || [ "$rc" -eq 0 ] || fails=$((fails + 1))
done
note "repeat: ${REPEAT:-5} suite runs, ${SELFTESTS:-2} selftest runs on GPU 0: $fails not clean, $((SECONDS - t0)) s"
exit $((fails > 0))
