#!/usr/bin/env bash
# the CPU tests' GPU fixtures recorded again: launch traces, pybind traces (tests/fixtures/launches/), OOM messages (tests/fixtures/oom/)
# Each recorder lives beside its fixtures. The new files are in $OUT/record.tgz (record/launches,
# record/oom): compare them, then copy what should change into tests/fixtures/ (the launch
# recorder also writes cost.json: not a fixture). RECORD (default "launches pybind oom") picks.
RECORD=${RECORD:-launches pybind oom}
rec() {  # name, script, output folder
  local t0=$SECONDS
  "$PY" "$2" "$3" >"$S/$1.log" 2>&1
  note "record $1: rc=$? in $((SECONDS - t0)) s: $(tail -1 "$S/$1.log")"
}
[[ " $RECORD " == *" launches "* ]] && rec launches tests/fixtures/launches/record_launch_traces.py "$S/launches"
[[ " $RECORD " == *" pybind "* ]] && rec pybind tests/fixtures/launches/record_pybind_traces.py "$S/launches"
[[ " $RECORD " == *" oom "* ]] && rec oom tests/fixtures/oom/record_oom_messages.py "$S/oom"
ls -l "$S"/launches "$S"/oom 2>/dev/null
true
