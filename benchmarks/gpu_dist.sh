#!/usr/bin/env bash
# gpucheck run --distributed on the GPUs of one host (written for nvidia-h200-x2; works on one
# GPU as a world of 1): build the kernels, the dist suite (DDP step fp32/bf16/fp16, distributed
# rendering) with NCCL, every defect of dist_selftest with its time to finding, the NVML orphan
# check after each kill, probes of the NCCL flight recorder and of TORCH_DISTRIBUTED_DEBUG=DETAIL
# under DDP. Run from the repo root; logs in $OUT (or ./dist-logs), tarred to dist-logs.tar.gz.
# Env: PYTHON (default python3), DIST_TIMEOUT (per-case timeout of the defects run, default 30).
set -u -o pipefail
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
export GPUCHECK_KERNELS=ssim,splat PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
LOGS=${OUT:-dist-logs}/logs
mkdir -p "$LOGS"
finish() { tar -czf "$LOGS/../dist-logs.tar.gz" -C "$LOGS" . ; }
trap finish EXIT
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee "$LOGS/gpu.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())" | tee -a "$LOGS/gpu.txt"
command -v py-spy >/dev/null && echo "py-spy: $(py-spy --version)" || echo "py-spy: not installed"
start=$(date +%s)
if ! "$PY" -m pip install -v --no-deps --no-build-isolation -e . > "$LOGS/build.log" 2>&1; then
  tail -60 "$LOGS/build.log"; exit 1
fi
echo "build: $(( $(date +%s) - start )) s"

# 1. the dist suite: one rank per GPU, NCCL
start=$(date +%s)
timeout 420 "$PY" -m gpucheck.cli run --distributed --all-devices --suite dist --timeout 300 \
  --out "$LOGS/dist" --quiet > "$LOGS/dist.log" 2>&1
echo "dist suite rc=$? ($(( $(date +%s) - start )) s)"; tail -12 "$LOGS/dist.log"

# 2. every defect, each reported with the rank at fault within the timeout
start=$(date +%s)
timeout 500 "$PY" -m gpucheck.cli run --distributed --all-devices --suite dist_selftest \
  --timeout "${DIST_TIMEOUT:-30}" --out "$LOGS/defects" --quiet > "$LOGS/defects.log" 2>&1
echo "defects rc=$? ($(( $(date +%s) - start )) s)"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$LOGS/apps_after.csv"
echo "compute apps after the runs: $(( $(wc -l < "$LOGS/apps_after.csv") - 1 ))"

# 3. probes: the flight recorder's dump as the watchdog reads it; DETAIL under DDP
timeout 120 "$PY" benchmarks/dist_probes.py > "$LOGS/probes.log" 2>&1
echo "probes rc=$?"; tail -8 "$LOGS/probes.log"

# 4. the tables
"$PY" benchmarks/dist_summary.py "$LOGS/dist" "$LOGS/defects" | tee "$LOGS/summary.txt"
