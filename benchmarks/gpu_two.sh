#!/usr/bin/env bash
# On a 2-GPU machine: build, `gpucheck selftest --all-devices --sanitizer`, every landed suite
# with `gpucheck run --all-devices` (detectors on), the example extension's builds
# (examples/custom_rnn_extension/check_all_builds.sh) and, when it exists, the distributed
# checks (benchmarks/gpu_dist.sh). Each step's output is archived into $OUT as soon as it ends.
# Usage: OUT=/dir [STEPS="selftest suites example dist"] bash benchmarks/gpu_two.sh
set -uo pipefail
STEPS=${STEPS:-selftest suites example dist}
step() { [[ " $STEPS " == *" $1 "* ]]; }
FINAL=${OUT:-/tmp/gpucheck-two}
WORK=${WORK:-/tmp/gpucheck-two-work}
mkdir -p "$FINAL" "$WORK"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=32 GPUCHECK_KERNELS=ssim,knn,splat
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
python3 -c "import torch; print(torch.__version__, torch.cuda.device_count(), torch.cuda.can_device_access_peer(0, 1))"
# WHEELS: a folder of wheels to install first (plyfile for the checkpoint rows: no network here)
if [ -n "${WHEELS:-}" ]; then python3 -m pip install -q --no-deps --no-index "$WHEELS"/*.whl; fi
t0=$SECONDS
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
if step selftest; then
t0=$SECONDS
python3 -m gpucheck.cli selftest --all-devices --sanitizer --out "$WORK/selftest" >"$WORK/selftest.log" 2>&1
echo "selftest: rc=$? in $((SECONDS - t0)) s"
tar czf "$FINAL/selftest.tgz" -C "$WORK" selftest selftest.log 2>/dev/null
tail -45 "$WORK/selftest.log"
fi
if step suites; then
t0=$SECONDS
python3 -m gpucheck.cli run --all-devices --suite ssim --suite knn --suite splat --quiet \
  --out "$WORK/suites" -- -m "not slow" >"$WORK/suites.log" 2>&1
echo "suites: rc=$? in $((SECONDS - t0)) s"
tar czf "$FINAL/suites.tgz" -C "$WORK" suites suites.log 2>/dev/null
python3 - "$WORK/suites" <<'PY'
import json, sys
from pathlib import Path
recs = [json.loads(l) for l in (Path(sys.argv[1]) / "results.jsonl").open()]
by = {}
for r in recs:
    if r.get("record") == "case":
        k = (r["device"], r["suite"], r["mode"], r["status"])
        by[k] = by.get(k, 0) + 1
for k, v in sorted(by.items()):
    print(k, v)
finds = [(r["device"], r["case"][:70], f["kind"], f["message"][:140]) for r in recs
         if r.get("record") in ("case", "diagnosis") for f in r.get("findings", [])]
print(f"findings: {len(finds)}")
for f in finds[:25]:
    print("  ", f)
PY
tail -2 "$WORK/suites.log"
fi
if step example; then
  t0=$SECONDS
  OUT="$WORK/example" bash examples/custom_rnn_extension/check_all_builds.sh >"$WORK/example.log" 2>&1
  echo "example: rc=$? in $((SECONDS - t0)) s"
  tar czf "$FINAL/example.tgz" -C "$WORK" example example.log 2>/dev/null
  tail -40 "$WORK/example.log"
fi
if step dist && [ -f benchmarks/gpu_dist.sh ]; then
  t0=$SECONDS
  OUT="$WORK/dist" bash benchmarks/gpu_dist.sh >"$WORK/dist.log" 2>&1
  echo "dist: rc=$? in $((SECONDS - t0)) s"
  tar czf "$FINAL/dist.tgz" -C "$WORK" dist dist.log 2>/dev/null
  tail -40 "$WORK/dist.log"
fi
