#!/usr/bin/env bash
# the self-test's defect x detector table of the selftest run folder (RUN=DIR: another one, e.g. a recorded run)
# Pure Python, no GPU needed: `RUN=tests/fixtures/run_h200x2_selftest tools/gpu matrix`.
run=${RUN:-$WORK/selftest/run}
tables matrix "$run" | tee "$S/table.txt"
rc=${PIPESTATUS[0]}
note "matrix of $(basename "$run"): $(tail -1 "$S/table.txt")"
exit "$rc"
