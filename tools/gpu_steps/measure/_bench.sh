#!/usr/bin/env bash
# helper of the bench-* steps (sourced, not a step): a kernel's GPU suite, then its benchmark
# bench KERNEL: pytest suites/<kernel> (-m "$SUITE_MARKERS", default "not slow"; SKIP_SUITE=1 skips
# it), then `python benchmarks/<kernel>.py --json $S/bench.json $BENCH_ARGS`. BASE=DIR: another
# checkout (e.g. `git archive` of main) built in place (setup.py build_ext --inplace) and
# benchmarked first with this checkout's script, for a before -> after table from one call.
bench() {
  local k=$1 rc=0 brc
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv \
    | tee "$S/gpu.txt"
  if [ "${SKIP_SUITE:-0}" != 1 ]; then
    timeout -k 30 "$STEP_TIMEOUT" "$PY" -m pytest "suites/$k" -q -rfEs -p no:cacheprovider \
      -m "${SUITE_MARKERS:-not slow}" --junitxml="$S/suite.xml" >"$S/suite.log" 2>&1
    rc=$?
    tail -15 "$S/suite.log"
    note "suites/$k (-m \"${SUITE_MARKERS:-not slow}\"): rc=$rc: $(tail -1 "$S/suite.log")"
  fi
  if [ -n "${BASE:-}" ]; then
    (cd "$BASE" && "$PY" setup.py build_ext --inplace) >"$S/base-build.log" 2>&1 \
      || { tail -30 "$S/base-build.log"; return 1; }
    # shellcheck disable=SC2086  # BENCH_ARGS is split on purpose
    PYTHONPATH="$BASE${PYTHONPATH:+:$PYTHONPATH}" timeout -k 30 "$STEP_TIMEOUT" "$PY" \
      "benchmarks/$k.py" ${BENCH_ARGS:-} --json "$S/bench-base.json" >"$S/bench-base.log" 2>&1
    note "benchmarks/$k.py on BASE=$BASE: rc=$?"
    tail -15 "$S/bench-base.log"
  fi
  # shellcheck disable=SC2086
  timeout -k 30 "$STEP_TIMEOUT" "$PY" "benchmarks/$k.py" ${BENCH_ARGS:-} --json "$S/bench.json" \
    >"$S/bench.log" 2>&1
  brc=$?
  grep -v "^{" "$S/bench.log" | tail -40
  note "benchmarks/$k.py ${BENCH_ARGS:-}: rc=$brc (results: $S/bench.json)"
  return $(( rc || brc ))
}
