#!/usr/bin/env bash
# benchmarks/fingerprint_cost.py: what the numerics detector's fingerprint of one op call costs, under CUDA_LAUNCH_BLOCKING=1 (as in gpucheck run) and without
# BASE=DIR: another checkout's gpucheck (e.g. `git archive` of an older commit; no build needed)
# timed by this checkout's script before this one, at each CUDA_LAUNCH_BLOCKING: before -> after
# in one call (a file per run: fingerprint_cost_clb<0/1>[base].json, naming the numerics.py timed)
rc=0
for clb in 1 0; do
  for tree in ${BASE:+base} this; do
    path=${PYTHONPATH:-}
    [ "$tree" = base ] && path=$BASE${PYTHONPATH:+:$PYTHONPATH}
    log=$S/fingerprint_cost_clb${clb}${tree/this/}.log
    PYTHONPATH=$path CUDA_LAUNCH_BLOCKING=$clb timeout -k 30 "$STEP_TIMEOUT" "$PY" \
      benchmarks/fingerprint_cost.py --json "${log%.log}.json" >"$log" 2>&1 || rc=$?
    tail -10 "$log"
  done
done
note "fingerprint_cost${BASE:+ (BASE=$BASE first)}: rc=$rc"
exit "$rc"
