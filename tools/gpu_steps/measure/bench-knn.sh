#!/usr/bin/env bash
# suites/knn on one GPU, then benchmarks/knn.py (BENCH_ARGS, BASE= for a before -> after table); numbers for benchmarks/RESULTS.md
. "$STEPS_DIR/measure/_bench.sh"
bench knn
