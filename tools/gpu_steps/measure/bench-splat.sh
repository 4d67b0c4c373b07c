#!/usr/bin/env bash
# suites/splat on one GPU, then benchmarks/splat.py (BENCH_ARGS, BASE= for a before -> after table); numbers for benchmarks/RESULTS.md
. "$STEPS_DIR/measure/_bench.sh"
bench splat
