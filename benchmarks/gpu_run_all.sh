#!/usr/bin/env bash
# Every landed suite through the harness on this machine's GPUs, detectors on: the check that
# correct kernels draw no finding. Usage: OUT=/dir bash benchmarks/gpu_run_all.sh
set -uo pipefail
FINAL=${OUT:-/tmp/gpucheck-run-all}
WORK=${WORK:-/tmp/gpucheck-run-all-work}
mkdir -p "$FINAL" "$WORK"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 GPUCHECK_KERNELS=ssim,knn,splat
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$SECONDS
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
t0=$SECONDS
python3 -m gpucheck.cli run --all-devices ${SUITES:---suite ssim --suite knn --suite splat} \
  --quiet --out "$WORK/run" -- ${PYTEST_ARGS:--m "not slow"} >"$WORK/run.log" 2>&1
echo "run: rc=$? in $((SECONDS - t0)) s"
python3 - "$WORK/run" <<'PY'
import json, sys
from pathlib import Path
recs = [json.loads(l) for l in (Path(sys.argv[1]) / "results.jsonl").open()]
cases = [r for r in recs if r.get("record") == "case"]
by = {}
for r in cases:
    by.setdefault((r["suite"], r["status"]), 0)
    by[(r["suite"], r["status"])] += 1
print(sorted(by.items()))
finds = [(r["case"], f["kind"], f["message"][:160]) for r in recs
         if r.get("record") in ("case", "diagnosis") for f in r.get("findings", [])]
print(f"findings: {len(finds)}")
for f in finds[:30]:
    print("  ", f)
print("fingerprinted cases:", sum(1 for r in cases if r.get("fingerprints")))
PY
tar czf "$FINAL/run_all.tgz" -C "$WORK" run run.log 2>/dev/null
tail -3 "$WORK/run.log"
