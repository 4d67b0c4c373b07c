#!/usr/bin/env bash
# the example extension's four builds under gpucheck run and pytest -n 1 (examples/custom_rnn_extension/check_all_builds.sh)
t0=$SECONDS
OUT="$S/example" bash examples/custom_rnn_extension/check_all_builds.sh >"$S/example.log" 2>&1
rc=$?
tail -40 "$S/example.log"
note "example: rc=$rc in $((SECONDS - t0)) s"
exit "$rc"
