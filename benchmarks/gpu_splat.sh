#!/usr/bin/env bash
# Build the splat kernel only, run its GPU suites (forward and gradients) and its benchmark.
# Run from the repo root on a GPU machine. Logs go to $OUT (or ./splat-logs), tarred into splat-logs.tar.gz.
# Env: PYTHON (default python3), SPLAT_SUITE_ARGS (extra pytest args), SPLAT_SKIP_CLI=1.
set -u -o pipefail
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
export GPUCHECK_KERNELS=splat PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOGS=${OUT:-splat-logs}/logs
mkdir -p "$LOGS"
finish() { tar -czf "$LOGS/../splat-logs.tar.gz" -C "$LOGS" . ; }
trap finish EXIT
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee "$LOGS/gpu.txt"
start=$(date +%s)
if ! "$PY" -m pip install -v --no-deps --no-build-isolation -e . > "$LOGS/build.log" 2>&1; then
  tail -60 "$LOGS/build.log"; exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
grep -E "not building|spill|stack frame|warning" "$LOGS/build.log" | sort | uniq -c | head -8
start=$(date +%s)
timeout ${SPLAT_SUITE_TIMEOUT:-300} "$PY" -m pytest suites/splat -q -rfE -p no:cacheprovider ${SPLAT_SUITE_ARGS:-} \
  > "$LOGS/suite.log" 2>&1
echo "suite rc=$? ($(( $(date +%s) - start )) s)"
tail -40 "$LOGS/suite.log"
timeout ${SPLAT_BENCH_TIMEOUT:-240} "$PY" benchmarks/splat.py --json "$LOGS/bench.json" > "$LOGS/bench.log" 2>&1
echo "bench rc=$?"; cat "$LOGS/bench.log" | tail -60
if [ "${SPLAT_SKIP_CLI:-0}" != 1 ]; then
  start=$(date +%s)
  timeout 200 "$PY" -m gpucheck.cli run --all-devices --suite splat --out "$LOGS/run" \
    > "$LOGS/cli.log" 2>&1
  echo "cli rc=$? ($(( $(date +%s) - start )) s)"; tail -15 "$LOGS/cli.log"
fi
