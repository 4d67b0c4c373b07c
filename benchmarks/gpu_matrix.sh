#!/usr/bin/env bash
# The self-test matrix, every bundled suite and the detectors' cost on whatever GPUs are
# visible, in steps that fit the device tool's 10-minute calls: a step cut by its timeout is
# continued by the next call's `resume` step on the same (warm) machine, since the run folders
# and the kernel cache live in build/ (ignored, kept between calls there).
#
#   install   editable install (sm_90), wheels from $WHEELS (plyfile: the checkpoint rows)
#   selftest  gpucheck selftest --sanitizer (--all-devices when 2+ GPUs), cut at $STEP_TIMEOUT
#   resume    gpucheck run --resume on that run folder, until it ends
#   matrix    the self-test's defect x detector table from the run folder
#   suites    gpucheck run --all-devices over the bundled suites (ssim knn splat reference
#             checkpoints), then the dist suite on NCCL; counts per device, findings
#   cost      knn + ssim + splat in blocking+nvml with every detector on, and with
#             GPUCHECK_DISABLE_DETECTORS=all: with 2 GPUs both at once, then swapped
#   selftest1 gpucheck selftest --sanitizer on GPU 0 alone (CUDA_VISIBLE_DEVICES=0)
#
# Usage: OUT=/dir STEPS="install selftest" [WHEELS=.gpu-run/wheels] bash benchmarks/gpu_matrix.sh
set -uo pipefail
STEPS=${STEPS:-install selftest matrix}
step() { [[ " $STEPS " == *" $1 "* ]]; }
FINAL=${OUT:-/tmp/gpucheck-matrix}
WORK=${WORK:-$PWD/build/gpu-work}
STEP_TIMEOUT=${STEP_TIMEOUT:-500}
mkdir -p "$FINAL" "$WORK"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 GPUCHECK_KERNELS=ssim,knn,splat
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GPUCHECK_CACHE_DIR=$PWD/build/gpucache
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl && export PYTHONPATH=/tmp/site
fi
NGPU=$(nvidia-smi -L | wc -l)
ALL=(); [ "$NGPU" -gt 1 ] && ALL=(--all-devices)
summary=()
note() { summary+=("$1"); echo "$1"; }
archive() { tar czf "$FINAL/$1.tgz" -C "$WORK" --exclude=cache --exclude='*.so' "$@" 2>/dev/null; }
if step install; then
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.device_count())"
  t0=$SECONDS
  python3 -m pip install -q --no-deps --no-build-isolation -e . >"$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log"; exit 1; }
  note "install: $((SECONDS - t0)) s"
fi
if step selftest; then
  t0=$SECONDS
  rm -rf "$WORK/selftest"
  timeout -k 30 "$STEP_TIMEOUT" python3 -m gpucheck.cli selftest "${ALL[@]}" --sanitizer \
    --out "$WORK/selftest" >"$WORK/selftest.log" 2>&1
  note "selftest ${ALL[*]} --sanitizer: rc=$? (124/143: cut, resume next) in $((SECONDS - t0)) s"
  archive selftest selftest.log
fi
if step resume; then
  t0=$SECONDS
  timeout -k 30 "$STEP_TIMEOUT" python3 -m gpucheck.cli run --resume "$WORK/selftest" \
    >"$WORK/resume.log" 2>&1
  note "selftest resumed: rc=$? (1: its defects are findings) in $((SECONDS - t0)) s"
  tail -5 "$WORK/resume.log"
  archive selftest selftest.log resume.log
fi
if step selftest1; then
  t0=$SECONDS
  rm -rf "$WORK/selftest1"
  CUDA_VISIBLE_DEVICES=0 timeout -k 30 "$STEP_TIMEOUT" python3 -m gpucheck.cli selftest \
    --sanitizer --out "$WORK/selftest1" >"$WORK/selftest1.log" 2>&1
  note "selftest --sanitizer on GPU 0 alone: rc=$? (2: complete but for the 2-GPU rows) in $((SECONDS - t0)) s"
  archive selftest1 selftest1.log
  grep -E "found|missed|not run|false positive" "$WORK/selftest1.log" | tail -45
fi
if step suites; then
  t0=$SECONDS
  rm -rf "$WORK/suites" "$WORK/dist"
  timeout -k 30 "$STEP_TIMEOUT" python3 -m gpucheck.cli run "${ALL[@]}" --quiet --suite ssim \
    --suite knn --suite splat --suite reference --suite checkpoints --out "$WORK/suites" \
    >"$WORK/suites.log" 2>&1
  note "suites ssim knn splat reference checkpoints ${ALL[*]}: rc=$? (0: no finding) in $((SECONDS - t0)) s"
  t0=$SECONDS
  timeout -k 30 240 python3 -m gpucheck.cli run "${ALL[@]}" --quiet --distributed --suite dist --timeout 120 \
    --out "$WORK/dist" >"$WORK/dist.log" 2>&1
  note "suite dist (NCCL, one rank per GPU): rc=$? in $((SECONDS - t0)) s"
  archive suites suites.log dist dist.log
fi
cost_run() {  # GPU, label, value of GPUCHECK_DISABLE_DETECTORS
  CUDA_VISIBLE_DEVICES=$1 GPUCHECK_DISABLE_DETECTORS=$3 python3 -m gpucheck.cli run --quiet \
    --suite ssim --suite knn --suite splat --out "$WORK/cost_$2" \
    -- -m "not slow" >"$WORK/cost_$2.log" 2>&1
}
if step cost; then
  t0=$SECONDS
  rm -rf "$WORK"/cost_*
  if [ "$NGPU" -gt 1 ]; then
    cost_run 0 on_a "" & cost_run 1 off_a all & wait
    cost_run 0 off_b all & cost_run 1 on_b "" & wait
  else
    cost_run 0 on_a ""; cost_run 0 off_a all; cost_run 0 off_b all; cost_run 0 on_b ""
  fi
  note "cost: 4 runs in $((SECONDS - t0)) s"
  archive cost_on_a cost_off_a cost_on_b cost_off_b
fi
python3 - "$WORK" "$STEPS" >"$WORK/table.txt" 2>&1 <<'PY'
import json, statistics, sys
from collections import Counter
from pathlib import Path

from gpucheck import selftest

work, steps = Path(sys.argv[1]), sys.argv[2].split()

def records(run):
    path = work / run / "results.jsonl"
    out = []
    if path.exists():
        for line in path.open():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out

for run in [r for r in ("selftest", "selftest1") if r in steps or (r == "selftest" and
            ("matrix" in steps or "resume" in steps))]:
    if not (work / run / "results.jsonl").exists():
        continue
    rows, false = selftest.matrix(*selftest.read_run(work / run))
    print(f"\n{run}: {'defect':60} {'kind':18} result   detail")
    for r in rows:
        print(f"  {r.defect.name[:60]:60} {r.defect.kind:18} {r.status:8} {r.detail[:110]}")
    print(f"  false positives on clean cases: {len(false)}")
    for f in false:
        print(f"  FALSE POSITIVE {f['case']} {f['mode']}: {f['kind']}: {f['message'][:160]}")
    end = [r for r in records(run) if r.get("record") == "end"]
    print(f"  ended: {end[-1] if end else 'no end record'}")

for run in ("suites", "dist"):
    cases = [r for r in records(run) if r.get("record") == "case"]
    if not cases or "suites" not in steps:
        continue
    by = Counter((r["device"], r["suite"], r["status"]) for r in cases)
    print(f"\n{run}: case records per device, suite, status")
    for k, v in sorted(by.items()):
        print(f"  {k} {v}")
    found = [(r["device"], r["case"], f) for r in records(run)
             if r.get("record") in ("case", "diagnosis") for f in r.get("findings", [])]
    print(f"  findings: {len(found)}")
    for dev, case, f in found[:25]:
        print(f"   {dev} {case[:70]}: {f['kind']}/{f['severity']}: {f['message'][:150]}")

if "cost" in steps:
    runs, suite_of = {}, {}
    for lab in ("on_a", "off_a", "on_b", "off_b"):
        runs[lab] = {}
        for r in records(f"cost_{lab}"):
            if r.get("record") == "case" and r.get("status") == "passed":
                runs[lab][r["case"]] = r["duration_s"]
                suite_of[r["case"]] = r["suite"]
    common = set.intersection(*(set(v) for v in runs.values())) if all(runs.values()) else set()
    print(f"\ncost: {len(common)} cases passed in all four runs (blocking+nvml)")
    if common:
        def both(lab_a, lab_b, cs):
            return sum(runs[lab_a][c] + runs[lab_b][c] for c in cs)
        for lab, v in runs.items():
            print(f"  {lab:6} sum of case time {sum(v[c] for c in common):8.2f} s")
        ratios = [both("on_a", "on_b", [c]) / max(both("off_a", "off_b", [c]), 1e-9)
                  for c in common]
        print(f"  detectors on / off: {both('on_a', 'on_b', common) / both('off_a', 'off_b', common):.3f}"
              f" (sum of case time), per-case median {statistics.median(ratios):.3f}")
        for suite in sorted({suite_of[c] for c in common}):
            cs = [c for c in common if suite_of[c] == suite]
            on, off = both("on_a", "on_b", cs), both("off_a", "off_b", cs)
            print(f"  {suite:8} {len(cs):4} cases  on {on / 2:7.2f} s  off {off / 2:7.2f} s"
                  f"  ratio {on / off:.3f}")
PY
cp "$WORK/table.txt" "$FINAL/table.txt"
printf '%s\n' "${summary[@]}" >"$FINAL/summary.txt"
cat "$WORK/table.txt"
