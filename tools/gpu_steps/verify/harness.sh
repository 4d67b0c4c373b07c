#!/usr/bin/env bash
# the harness on the selftest suite (blocking+nvml, and memcheck with SANITIZER=1): good cases pass on every device, each defect reported
# tools/gpu_steps/verify/harness_check.py prints one PASS/FAIL line per check.
san=(); [ "${SANITIZER:-0}" = 1 ] && san=(--sanitizer)
"$PY" "$STEPS_DIR/verify/harness_check.py" "$S/out" "${san[@]}" >"$S/harness.log" 2>&1
rc=$?
grep -E "^(PASS|FAIL)" "$S/harness.log"
note "harness ${san[*]}: rc=$rc, $(grep -c '^PASS' "$S/harness.log") PASS, $(grep -c '^FAIL' "$S/harness.log") FAIL"
exit "$rc"
