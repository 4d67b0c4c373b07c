#!/usr/bin/env bash
# unwritten outputs (a culled-rows convention: clean; masked tiles: unwritten-output) and sanitizer records traced to the op (initcheck, racecheck, memcheck, the per-case print budget)
# tools/gpu_steps/verify/unwritten.py builds a small CUDA pybind11 extension, runs gpucheck
# on GPU 0 in the plain pass and under initcheck, racecheck and memcheck, and prints one
# PASS/FAIL line per check with the findings' messages; its run folders and logs are in $S.
# One GPU is enough; needs gpucheck importable (the install step).
t0=$SECONDS
"$PY" "$STEPS_DIR/verify/unwritten.py" "$S/out" >"$S/unwritten.log" 2>&1
rc=$?
grep -E "^(PASS|FAIL|-- )" "$S/unwritten.log"
note "unwritten: rc=$rc in $((SECONDS - t0)) s, $(grep -c '^PASS' "$S/unwritten.log") PASS, $(grep -c '^FAIL' "$S/unwritten.log") FAIL"
exit "$rc"
