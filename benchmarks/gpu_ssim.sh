#!/usr/bin/env bash
# Build only the SSIM kernel, run its GPU suite and its benchmark (on the lent GPU machine).
# Usage (from the repository root): bash benchmarks/gpu_ssim.sh [pytest -m expression]
# Logs go to $OUT (or ./ssim-gpu-logs when OUT is unset). BASE=<dir>: another checkout (e.g.
# `git archive main`) built in place and benchmarked first with this benchmark script, for a
# before -> after table from one run. BENCH_ARGS: extra arguments of benchmarks/ssim.py.
set -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
export GPUCHECK_KERNELS=ssim PYTHONUNBUFFERED=1
out=${OUT:-ssim-gpu-logs}
mkdir -p "$out"
marks=${1:-not slow}
start=$(date +%s)
py=${PYTHON:-python3}
# `$py -m pip`: a bare `pip` may belong to another interpreter, whose setup.py run then
# cannot import torch and silently installs the package without the extension. setup.py
# always rebuilds and copies gpucheck/_C*.so into the checkout for editable installs.
$py -m pip install -v --no-deps --no-build-isolation -e . > "$out/build.log" 2>&1 \
  || { tail -60 "$out/build.log"; exit 1; }
grep -a "gpucheck: not building" "$out/build.log"
echo "build: $(( $(date +%s) - start )) s"
$py -c "import torch, gpucheck._C; print('ops:', torch.ops.gpucheck.ssim_forward.default)" || exit 1
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
timeout ${SUITE_TIMEOUT:-130} $py -m pytest suites/ssim -q -rs -p no:cacheprovider -m "$marks" --maxfail=25 2>&1 \
  | tee "$out/suite.log" | tail -40
suite_rc=$?
if [ -n "$BASE" ]; then
  (cd "$BASE" && $py setup.py build_ext --inplace > "$out/base-build.log" 2>&1) \
    || { tail -30 "$out/base-build.log"; exit 1; }
  PYTHONPATH="$BASE" timeout ${BENCH_TIMEOUT:-110} $py benchmarks/ssim.py $BENCH_ARGS \
    --json "$out/bench-base.json" 2>&1 | tee "$out/bench-base.log" | tail -9
fi
timeout ${BENCH_TIMEOUT:-110} $py benchmarks/ssim.py $BENCH_ARGS --json "$out/bench.json" 2>&1 \
  | tee "$out/bench.log" | tail -12
bench_rc=$?
echo "suite rc=$suite_rc bench rc=$bench_rc total $(( $(date +%s) - start )) s"
