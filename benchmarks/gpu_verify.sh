#!/usr/bin/env bash
# Everything gpucheck verifies on a multi-GPU machine, in one call (run from the repo root):
# build, device discovery, the harness self-test, the suites on every device (blocking+nvml),
# and optionally the sanitizer pass. Logs go to $VERIFY_DIR (default /tmp/gpu-verify), packed
# into $OUT/verify.tgz when $OUT is set.
# Env: GPUCHECK_KERNELS (build subset), SUITES ("knn ssim"), SUITE_ARGS (pytest args after --),
#      SANITIZER=1 (also run sanitizer:memcheck), STEPS ("build discovery selftest suites").
set -u -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUTDIR=${VERIFY_DIR:-/tmp/gpu-verify}
STEPS=${STEPS:-build discovery selftest suites}
mkdir -p "$OUTDIR"
summary=()
step() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
t() { date +%s; }
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader | tee "$OUTDIR/gpus.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count())"

if step build; then
  s=$(t)
  if "$PY" -m pip install -v --no-deps --no-build-isolation -e . > "$OUTDIR/build.log" 2>&1 \
     && "$PY" -c "import torch, gpucheck._C"; then
    summary+=("build: ok ($(( $(t) - s )) s; kernels ${GPUCHECK_KERNELS:-all})")
  else
    tail -40 "$OUTDIR/build.log"; summary+=("build: FAILED"); fi
  grep -a "gpucheck:" "$OUTDIR/build.log" | sort -u | head -3
fi
if step discovery; then
  s=$(t)
  "$PY" benchmarks/verify_discovery.py "$OUTDIR/discovery" > "$OUTDIR/discovery.log" 2>&1
  rc=$?; grep -E "^(PASS|FAIL)" "$OUTDIR/discovery.log"
  summary+=("discovery: exit $rc ($(( $(t) - s )) s)")
fi
if step selftest; then
  s=$(t)
  san=(); [ "${SANITIZER:-0}" = 1 ] && san=(--sanitizer)
  "$PY" benchmarks/verify_harness.py "$OUTDIR/selftest" "${san[@]}" > "$OUTDIR/selftest.log" 2>&1
  rc=$?; grep -E "^(PASS|FAIL)" "$OUTDIR/selftest.log"
  summary+=("selftest: exit $rc ($(( $(t) - s )) s)")
fi
if step suites; then
  for mode in blocking+nvml ${SANITIZER:+sanitizer:memcheck}; do
    [ "$mode" = "sanitizer:memcheck" ] && [ "${SANITIZER:-0}" != 1 ] && continue
    s=$(t)
    margs=(--mode blocking --mode nvml); [ "$mode" = "sanitizer:memcheck" ] && margs=(--mode sanitizer:memcheck)
    sargs=(); for x in ${SUITES:-knn ssim}; do sargs+=(--suite "$x"); done
    # shellcheck disable=SC2086
    "$PY" -m gpucheck.cli run --all-devices --quiet "${sargs[@]}" "${margs[@]}" \
      --out "$OUTDIR/run-${mode%%:*}" --timeout 300 -- ${SUITE_ARGS:-} > "$OUTDIR/run-${mode%%:*}.log" 2>&1
    rc=$?; tail -15 "$OUTDIR/run-${mode%%:*}.log"
    summary+=("suites $mode: exit $rc ($(( $(t) - s )) s)")
  done
fi
[ -n "${OUT:-}" ] && tar -C "$(dirname "$OUTDIR")" -czf "$OUT/verify.tgz" "$(basename "$OUTDIR")"
printf '%s\n' "== summary" "${summary[@]}"
