#!/usr/bin/env bash
# gpucheck run --distributed on the GPUs of one host (written for nvidia-h200-x2; works on one
# GPU as a world of 1): build the kernels, the dist suite (DDP step fp32/bf16/fp16, distributed
# rendering) with NCCL, every defect of dist_selftest with its time to finding, the NVML orphan
# check after each kill, probes of the NCCL flight recorder and of TORCH_DISTRIBUTED_DEBUG=DETAIL
# under DDP, and the same entry started by torchrun. Run from the repo root; logs in $OUT (or
# ./dist-logs), tarred to dist-logs.tar.gz. Env: PYTHON (default python3), DIST_TIMEOUT (per-case
# timeout of the defects runs, default 30), DIST_STEPS (default "suite defects torchrun probes").
set -u -o pipefail
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
export GPUCHECK_KERNELS=ssim,splat PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
DIST_STEPS=${DIST_STEPS:-suite defects torchrun probes}
want() { [[ " $DIST_STEPS " == *" $1 "* ]]; }
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
if want suite; then
start=$(date +%s)
timeout 420 "$PY" -m gpucheck.cli run --distributed --all-devices --suite dist --timeout 300 \
  --out "$LOGS/dist" --quiet > "$LOGS/dist.log" 2>&1
echo "dist suite rc=$? ($(( $(date +%s) - start )) s)"; tail -12 "$LOGS/dist.log"
fi

# 2. every defect, each reported with the rank at fault within the timeout
if want defects; then
start=$(date +%s)
timeout 500 "$PY" -m gpucheck.cli run --distributed --all-devices --suite dist_selftest \
  --timeout "${DIST_TIMEOUT:-30}" --out "$LOGS/defects" --quiet > "$LOGS/defects.log" 2>&1
echo "defects rc=$? ($(( $(date +%s) - start )) s)"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$LOGS/apps_after.csv"
echo "compute apps after the runs: $(( $(wc -l < "$LOGS/apps_after.csv") - 1 ))"
fi

# 3. the same entry started by torchrun (one gpucheck process per rank, NCCL): the dist suite,
#    then a skipped collective, a crash on one rank and the clean case after them
if want torchrun; then
NGPU=$(nvidia-smi -L | wc -l)
start=$(date +%s)
timeout 300 "$PY" -m torch.distributed.run --nnodes 1 --nproc-per-node "$NGPU" \
  --master-port 29533 -m gpucheck.cli run --distributed --suite dist --timeout 300 \
  --out "$LOGS/torchrun" --quiet > "$LOGS/torchrun.log" 2>&1
echo "torchrun dist suite rc=$? ($(( $(date +%s) - start )) s)"; tail -6 "$LOGS/torchrun.log"
start=$(date +%s)
timeout 300 "$PY" -m torch.distributed.run --nnodes 1 --nproc-per-node "$NGPU" \
  --master-port 29534 -m gpucheck.cli run --distributed --suite dist_selftest \
  --timeout "${DIST_TIMEOUT:-30}" --out "$LOGS/torchrun-defects" --quiet \
  -- -k "skip_collective or crash_one_rank or clean" > "$LOGS/torchrun-defects.log" 2>&1
echo "torchrun defects rc=$? ($(( $(date +%s) - start )) s)"; tail -6 "$LOGS/torchrun-defects.log"
fi

# 4. probes: the flight recorder's dump as the watchdog reads it; DETAIL under DDP
if want probes; then
timeout 120 "$PY" benchmarks/dist_probes.py > "$LOGS/probes.log" 2>&1
echo "probes rc=$?"; tail -8 "$LOGS/probes.log"
fi

# 5. the tables
"$PY" benchmarks/dist_summary.py "$LOGS/dist" "$LOGS/defects" "$LOGS/torchrun" \
  "$LOGS/torchrun-defects" | tee "$LOGS/summary.txt"
