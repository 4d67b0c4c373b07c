#!/usr/bin/env bash
# Issue 27 on one GPU (H100/H200, < 6 min): per-call checks of a pybind11 extension.
#   1. install gpucheck editable (ssim, knn, splat; sm_90)
#   2. gpucheck selftest (no sanitizer): prebuilds every defect build, the pybind ones too, then
#      the defect x detector matrix (rows that need 2 GPUs: not run)
#   3. gpucheck run on the selftest suite, -k pybind: the new cases' findings, one per line
#   4. record the launch-trace windows of the pybind extension (tests/fixtures/launches/)
#   5. the ssim, knn and splat suites (-m "not slow"), every detector on: false positives
#   6. a short table: the pybind rows, false positives, each pybind case's findings, and the
#      suites' findings (there must be none)
# Usage: OUT=/some/dir bash benchmarks/gpu_pybind.sh (STEPS="install selftest run record suites")
# $OUT gets summary.txt, launches/pybind_*.json (copy them to tests/fixtures/launches/) and
# logs.tgz (every log and run folder; the device tool brings back 8 files).
set -uo pipefail
FINAL=${OUT:-/tmp/gpucheck-pybind}
WORK=${WORK:-/tmp/gpucheck-pybind-work}
STEPS=${STEPS:-install selftest run record suites}
mkdir -p "$FINAL/launches" "$WORK"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
export GPUCHECK_KERNELS=${GPUCHECK_KERNELS:-ssim,knn,splat}
export GPUCHECK_CACHE_DIR=${GPUCHECK_CACHE_DIR:-$WORK/cache}
step() { [[ " $STEPS " == *" $1 "* ]]; }
summary=()
if step install; then
  t0=$SECONDS
  python3 -m pip install -q --no-deps --no-build-isolation -e . >"$WORK/install.log" 2>&1 \
    || { tail -40 "$WORK/install.log"; exit 1; }
  summary+=("install: $((SECONDS - t0)) s")
fi
if step selftest; then
  t0=$SECONDS
  rm -rf "$WORK/selftest"
  # its prebuild runs ~16 builds at once and gives each a share of the cores (no MAX_JOBS)
  env -u MAX_JOBS python3 -m gpucheck.cli selftest --out "$WORK/selftest" \
    >"$WORK/selftest.log" 2>&1
  summary+=("selftest: rc=$? (2: complete but for the 2-GPU rows) in $((SECONDS - t0)) s")
fi
if step run; then
  t0=$SECONDS
  rm -rf "$WORK/run_pybind"
  SUITE=$(python3 -c "from gpucheck import _resources; print(_resources.suites() / 'selftest')")
  python3 -m gpucheck.cli run --suite "$SUITE" --quiet --out "$WORK/run_pybind" -- -k pybind \
    >"$WORK/run_pybind.log" 2>&1
  summary+=("run -k pybind: rc=$? (1: the defects are findings) in $((SECONDS - t0)) s")
fi
if step record; then
  t0=$SECONDS
  python3 benchmarks/record_pybind_traces.py "$WORK/launches" >"$WORK/record.log" 2>&1
  summary+=("record: rc=$? in $((SECONDS - t0)) s: $(tail -1 "$WORK/record.log")")
  cp "$WORK"/launches/pybind_*.json "$FINAL/launches/" 2>/dev/null
fi
if step suites; then
  t0=$SECONDS
  rm -rf "$WORK/suites"
  timeout "${SUITES_TIMEOUT:-900}" python3 -m gpucheck.cli run --suite ssim --suite knn --suite splat --quiet \
    --out "$WORK/suites" -- -m "not slow" >"$WORK/suites.log" 2>&1
  summary+=("suites ssim knn splat: rc=$? (0: no finding) in $((SECONDS - t0)) s")
fi
python3 - "$WORK" >"$WORK/table.txt" 2>&1 <<'PY'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
def records(run):
    path = work / run / "results.jsonl"
    return [json.loads(l) for l in path.open()] if path.exists() else []
from gpucheck import selftest
recs = [r for r in records("selftest") if r.get("record") in ("case", "diagnosis")]
if recs:
    gpus = len([d for d in next((r for r in records("selftest") if r.get("record") == "run"),
                                {}).get("devices", []) if str(d.get("device")).startswith("cuda")])
    rows, false = selftest.matrix(recs, gpus)
    print(f"{'selftest row':58} {'kind':18} {'result':8} detail")
    for r in rows:
        mark = "  <- new" if "pybind" in r.defect.case else ""
        print(f"{r.defect.name[:58]:58} {r.defect.kind:18} {r.status:8} {r.detail[:90]}{mark}")
    print(f"false positives on clean cases: {len(false)}")
    for f in false:
        print(f"  FALSE POSITIVE {f['case']} {f['mode']}: {f['kind']}: {f['message'][:160]}")
print("\nrun -k pybind (case: status; findings kind/severity op|kernel: message)")
for r in records("run_pybind"):
    if r.get("record") != "case":
        continue
    print(f"{r['case']}: {r['status']}")
    for f in r.get("findings", []):
        print(f"   {f['kind']}/{f['severity']} {f.get('op') or f.get('kernel')}: "
              f"{f['message'][:200]}")
        if f.get("hint") and f["kind"] in ("cuda-error", "mixed-devices"):
            print(f"      hint: {f['hint'][:200]}")
cases = [r for r in records("suites") if r.get("record") == "case"]
if cases:
    found = [(r["case"], f) for r in cases for f in r.get("findings", [])]
    bad = sum(r["status"] in ("failed", "error", "crashed", "hung") for r in cases)
    print(f"\nsuites ssim knn splat: {len(cases)} case records, {bad} failed, "
          f"{len(found)} findings (false positives unless a case failed)")
    for case, f in found[:30]:
        print(f"   {case}: {f['kind']}/{f['severity']} {f.get('op') or f.get('kernel')}: "
              f"{f['message'][:160]}")
PY
cp "$WORK/table.txt" "$FINAL/summary.txt"
printf '%s\n' "${summary[@]}" >>"$FINAL/summary.txt"
tar czf "$FINAL/logs.tgz" -C "$WORK" --exclude=cache --exclude='*.so' . 2>/dev/null
cat "$FINAL/summary.txt"
