#!/usr/bin/env bash
# suites/ssim on one GPU, then benchmarks/ssim.py (BENCH_ARGS, BASE= for a before -> after table); numbers for benchmarks/RESULTS.md
. "$STEPS_DIR/measure/_bench.sh"
bench ssim
