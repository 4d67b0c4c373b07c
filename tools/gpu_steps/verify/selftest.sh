#!/usr/bin/env bash
# gpucheck selftest --sanitizer (--all-devices on 2+ GPUs), cut at $STEP_TIMEOUT: `resume` continues it
# The run folder is $WORK/selftest/run (build/, kept on a warm machine); the table: `matrix`.
t0=$SECONDS
timeout -k 30 "$STEP_TIMEOUT" "$PY" -m gpucheck.cli selftest "${ALL[@]}" --sanitizer \
  --out "$S/run" >"$S/selftest.log" 2>&1
rc=$?
tail -5 "$S/selftest.log"
note "selftest ${ALL[*]} --sanitizer: rc=$rc (0 all found; 2 complete but rows that need 2 GPUs; 124/137: cut, run resume) in $((SECONDS - t0)) s"
exit "$rc"
