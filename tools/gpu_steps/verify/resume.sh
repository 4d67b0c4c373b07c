#!/usr/bin/env bash
# gpucheck run --resume on the selftest step's run folder (cut by the call's limit), until it ends
run=$WORK/selftest/run
[ -d "$run" ] || { note "resume: no run folder at $run"; exit 1; }
t0=$SECONDS
timeout -k 30 "$STEP_TIMEOUT" "$PY" -m gpucheck.cli run --resume "$run" >"$S/resume.log" 2>&1
rc=$?
tail -5 "$S/resume.log"
note "selftest resumed: rc=$rc (1: its defects are findings; 124/137: cut again) in $((SECONDS - t0)) s"
exit "$rc"
