#!/usr/bin/env bash
# Build the KNN kernel only, run its GPU suite and its benchmark (issue 4). Run from the repo
# root on a GPU machine. Logs go to $OUT (or ./knn-logs).
# Env: PYTHON (default python3: the interpreter that holds torch), KNN_SUITE_MARKERS (pytest -m
# expression, default: every test), KNN_BENCH_ARGS, KNN_SUITE_TIMEOUT / KNN_BENCH_TIMEOUT (s).
set -u -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
export GPUCHECK_KERNELS=knn PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOGS=${OUT:-knn-logs}
mkdir -p "$LOGS"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$LOGS/gpu.txt"
start=$(date +%s)
if ! "$PY" -m pip install -v --no-deps --no-build-isolation -e . > "$LOGS/build.log" 2>&1; then
  tail -60 "$LOGS/build.log"; exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
grep -E "not building|spill|stack frame" "$LOGS/build.log" | sort | uniq -c | head -5
"$PY" -c "import torch, gpucheck._C; print('extension loaded:', torch.ops.gpucheck.knn_mean_sq_dist)" || {
  tail -40 "$LOGS/build.log"; exit 1; }
# Raising an error from the op once killed the process on the GPU machine (SIGSEGV): check
# torch's own error path and ours in a child; on a crash, get the native stack from cuda-gdb.
cat > /tmp/knn_raise_repro.py <<'PY'
import torch
from gpucheck.ops.knn import op
try:
    torch.mm(torch.rand(2, 3, device="cuda"), torch.rand(2, 3, device="cuda"))
except RuntimeError as e:
    print("torch's own error raised fine:", str(e).splitlines()[0])
try:
    op()(torch.rand(10, 2, device="cuda"), 3)
except ValueError as e:
    print("knn error raised fine:", e)
PY
if ! "$PY" -X faulthandler /tmp/knn_raise_repro.py > "$LOGS/raise_repro.log" 2>&1; then
  echo "raise repro crashed:"; tail -5 "$LOGS/raise_repro.log"
  timeout "${KNN_GDB_TIMEOUT:-60}" cuda-gdb -batch -ex run -ex bt --args "$PY" /tmp/knn_raise_repro.py > "$LOGS/gdb.log" 2>&1
  grep -B2 -A30 "SIG" "$LOGS/gdb.log" | head -50
else
  cat "$LOGS/raise_repro.log"
fi
suite_rc=0
markers=(); [ -n "${KNN_SUITE_MARKERS:-}" ] && markers=(-m "$KNN_SUITE_MARKERS")
timeout "${KNN_SUITE_TIMEOUT:-170}" "$PY" -m pytest suites/knn -q -p no:cacheprovider \
  --junitxml="$LOGS/suite.xml" "${markers[@]}" 2>&1 | tee "$LOGS/suite.log" | tail -40 || suite_rc=$?
# shellcheck disable=SC2086
timeout "${KNN_BENCH_TIMEOUT:-120}" "$PY" benchmarks/knn.py --json "$LOGS/bench.json" \
  ${KNN_BENCH_ARGS:-} 2>&1 | tee "$LOGS/bench.log" | grep -v "^{" || true
echo "suite exit code: $suite_rc; total $(( $(date +%s) - start )) s"
exit "$suite_rc"
