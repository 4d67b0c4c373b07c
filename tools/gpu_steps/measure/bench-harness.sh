#!/usr/bin/env bash
# benchmarks/harness.py: the harness's own cost (one device vs --all-devices, NVML sampling, worker start-up)
# HARNESS_ARGS: its arguments after the output folder (default: --suite knn -- -m "not slow").
# shellcheck disable=SC2086  # HARNESS_ARGS is split on purpose
timeout -k 30 "$STEP_TIMEOUT" "$PY" benchmarks/harness.py "$S/out" \
  ${HARNESS_ARGS:---suite knn -- -m "not slow"} >"$S/harness.log" 2>&1
rc=$?
tail -20 "$S/harness.log"
note "benchmarks/harness.py: rc=$rc"
exit "$rc"
