#!/usr/bin/env bash
# benchmarks/cupti_window.py: what one launch-trace window costs by phase, and what every CUDA launch costs once CUPTI is attached
timeout -k 30 "$STEP_TIMEOUT" "$PY" benchmarks/cupti_window.py "$S/out" >"$S/cupti_window.log" 2>&1
rc=$?
tail -12 "$S/cupti_window.log"
cp "$S/out/cupti_window.json" "$S/" 2>/dev/null
note "cupti_window: rc=$rc"
exit "$rc"
