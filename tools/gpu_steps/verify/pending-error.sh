#!/usr/bin/env bash
# a real CUDA error left pending by a case (a failed call nothing read): without gpucheck the next test fails with it; gpucheck run, with each recorder, gives it to the case that left it
# tools/gpu_steps/verify/pending_error.py prints one PASS/FAIL line per check; its run folders
# and logs are in $S. One GPU is enough; needs gpucheck importable (the install step).
"$PY" "$STEPS_DIR/verify/pending_error.py" "$S/out" >"$S/pending_error.log" 2>&1
rc=$?
grep -E "^(PASS|FAIL)" "$S/pending_error.log"
note "pending-error: rc=$rc, $(grep -c '^PASS' "$S/pending_error.log") PASS, $(grep -c '^FAIL' "$S/pending_error.log") FAIL"
exit "$rc"
