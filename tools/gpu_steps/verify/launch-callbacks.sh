#!/usr/bin/env bash
# the launch trace's CUPTI-callback recorder: streams, devices, copies, a window of the trace, its cost against kineto's, a test's own profiler inside a window and after it
"$PY" "$STEPS_DIR/verify/launch_callbacks.py" "$S/out" >"$S/launch_callbacks.log" 2>&1
rc=$?
grep -E "^(PASS|FAIL)" "$S/launch_callbacks.log"
cp "$S/out/launch_callbacks.json" "$S/" 2>/dev/null
note "launch-callbacks: rc=$rc, $(grep -c '^PASS' "$S/launch_callbacks.log") PASS, $(grep -c '^FAIL' "$S/launch_callbacks.log") FAIL"
exit "$rc"
