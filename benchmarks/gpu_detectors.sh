#!/usr/bin/env bash
# Issue 9 on a GPU machine: build ssim + knn, record the launch-trace fixtures, measure the
# worker detectors' cost on the knn + ssim suites (all off, then on), run the self-test.
# Usage: OUT=/some/dir bash benchmarks/gpu_detectors.sh   (STEPS="build record cost selftest")
# Everything lands in $WORK; $OUT gets one archive of it (the device tool brings back 8 files).
set -uo pipefail
FINAL=${OUT:-/tmp/gpucheck-detectors}
OUT=${WORK:-/tmp/gpucheck-detectors-work}
STEPS=${STEPS:-build record cost selftest}
mkdir -p "$OUT" "$FINAL"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 GPUCHECK_KERNELS=${GPUCHECK_KERNELS:-ssim,knn}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() { [[ " $STEPS " == *" $1 "* ]]; }
summary=()
if step build; then
  t0=$SECONDS
  python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/build.log" 2>&1 \
    || { tail -40 "$OUT/build.log"; exit 1; }
  summary+=("build: $((SECONDS - t0)) s")
fi
if step record; then
  mkdir -p "$OUT/launches"
  python3 benchmarks/record_launch_traces.py "$OUT/launches" >"$OUT/record.log" 2>&1
  summary+=("record: rc=$? $(tail -1 "$OUT/record.log")")
fi
if step cost; then
  # detectors on first, then off: lazy initialization (module loading, first launches) lands
  # in the "on" run, so the measured cost is an upper bound
  python3 -m gpucheck.cli run --all-devices --suite knn --suite ssim --quiet --out "$OUT/on" \
    -- -m "not slow" >"$OUT/on.log" 2>&1
  summary+=("detectors on: rc=$? $(tail -1 "$OUT/on.log")")
  GPUCHECK_DISABLE_DETECTORS=all python3 -m gpucheck.cli run --all-devices --suite knn \
    --suite ssim --quiet --out "$OUT/off" -- -m "not slow" >"$OUT/off.log" 2>&1
  summary+=("detectors off: rc=$? $(tail -1 "$OUT/off.log")")
  python3 - "$OUT" >"$OUT/cost.txt" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def load(name):
    return {(r["device"], r["case"]): r for r in map(json.loads, (out / name / "results.jsonl").open())
            if r.get("record") == "case"}
off, on = load("off"), load("on")
common = sorted(set(off) & set(on))
t_off = sum(off[k]["duration_s"] for k in common)
t_on = sum(on[k]["duration_s"] for k in common)
print(f"cases {len(common)}: case time off {t_off:.2f} s, on {t_on:.2f} s, +{100 * (t_on / t_off - 1):.1f} %")
worst = sorted(common, key=lambda k: on[k]["duration_s"] - off[k]["duration_s"], reverse=True)[:12]
for k in worst:
    print(f"  {k[1]}: {off[k]['duration_s']:.3f} -> {on[k]['duration_s']:.3f} s")
finds = [(k, f["kind"], f["message"][:150]) for k in on for f in on[k]["findings"]]
print(f"findings with detectors on: {len(finds)}")
for f in finds[:20]:
    print("  ", f)
PY
  summary+=("$(head -1 "$OUT/cost.txt")")
fi
if step selftest; then
  t0=$SECONDS
  python3 -m gpucheck.cli selftest --sanitizer --out "$OUT/selftest" >"$OUT/selftest.log" 2>&1
  summary+=("selftest: rc=$? in $((SECONDS - t0)) s")
fi
tar czf "$FINAL/detectors.tgz" -C "$OUT" --exclude='*.so' --exclude=build . 2>/dev/null
cat "$OUT/cost.txt" 2>/dev/null
tail -30 "$OUT/selftest.log" 2>/dev/null
printf '%s\n' "${summary[@]}"
