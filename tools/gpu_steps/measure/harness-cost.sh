#!/usr/bin/env bash
# benchmarks/harness_cost.py: time to verdict, plain pytest (with and without CUDA_LAUNCH_BLOCKING) vs gpucheck run, side by side
# HC_ROUNDS: rounds (default 3); HC_ARGS: its arguments after the rounds (default: the bundled
# kernel suites, every variant). One device, the first visible one; the variant gpucheck-all
# runs on every visible device (N GPUs against one, and the machine's own scaling: HC_ARGS='--only
# pytest-clb --only pytest-clb-all --only gpucheck --only gpucheck-all').
# shellcheck disable=SC2086  # HC_ARGS is split on purpose
timeout -k 30 "$STEP_TIMEOUT" "$PY" benchmarks/harness_cost.py "$S/out" --rounds "${HC_ROUNDS:-3}" \
  ${HC_ARGS:-} >"$S/harness_cost.log" 2>&1
rc=$?
tail -70 "$S/harness_cost.log"
cp "$S/out/harness_cost.json" "$S/" 2>/dev/null
note "harness_cost: rc=$rc $(grep -m1 '^| gpucheck |' "$S/harness_cost.log")"
exit "$rc"
