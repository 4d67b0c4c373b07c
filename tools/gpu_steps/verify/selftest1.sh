#!/usr/bin/env bash
# gpucheck selftest --sanitizer on GPU 0 alone (CUDA_VISIBLE_DEVICES=0): the single-GPU matrix
t0=$SECONDS
CUDA_VISIBLE_DEVICES=0 timeout -k 30 "$STEP_TIMEOUT" "$PY" -m gpucheck.cli selftest --sanitizer \
  --out "$S/run" >"$S/selftest1.log" 2>&1
rc=$?
[ -f "$S/run/results.jsonl" ] && tables matrix "$S/run" | tee "$S/table.txt" | tail -40
note "selftest --sanitizer on GPU 0 alone: rc=$rc (2: complete but the 2-GPU rows) in $((SECONDS - t0)) s"
exit "$rc"
