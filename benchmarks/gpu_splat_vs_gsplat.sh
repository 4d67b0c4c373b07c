#!/usr/bin/env bash
# Side by side with gsplat 1.5.3 on one GPU (benchmarks/splat_vs_gsplat.py), after our splat
# kernel is built (benchmarks/gpu_splat.sh, or pip install -e . with GPUCHECK_KERNELS=splat).
# A GPU machine without network: carry gsplat's wheel (`pip download --no-deps gsplat==1.5.3`;
# its needs jaxtyping, wadler-lindig, rich, ninja, numpy, packaging are installed there, else
# carry their wheels too) in $GSPLAT_WHEELS (default .gsplat). gsplat JIT-compiles its CUDA
# sources on first use (minutes) into $TORCH_EXTENSIONS_DIR/gsplat_cuda/gsplat_cuda.so; pass
# that file back as GSPLAT_SO to skip the compile on a later run.
# Run from the repo root. Env: PYTHON, OUT (logs), VS_ARGS (extra arguments of the benchmark).
set -u -o pipefail
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOGS=${OUT:-splat-logs}
mkdir -p "$LOGS"
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/gsplat-site \
  "${GSPLAT_WHEELS:-.gsplat}"/*.whl || exit 1
export PYTHONPATH=/tmp/gsplat-site${PYTHONPATH:+:$PYTHONPATH}
so_args=()
if [ -n "${GSPLAT_SO:-}" ]; then so_args=(--gsplat-so "$GSPLAT_SO"); fi
# shellcheck disable=SC2086
"$PY" benchmarks/splat_vs_gsplat.py "${so_args[@]}" --json "$LOGS/vs_gsplat.json" ${VS_ARGS:-} \
  2>&1 | tee "$LOGS/vs_gsplat.log"
