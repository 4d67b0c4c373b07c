#!/usr/bin/env bash
# Can a run's output be trusted? Shown on a GPU machine, in one call (run from the repo root):
#  1. without the compiled extension: the default suites stop once with the fix (exit 2, no
#     worker, no report folder); a user's suite beside ours still runs; plain pytest on either
#     kernel suite gives one usage error;
#  2. with the extension built: a run, the same command again into the same --out (refused,
#     the first results untouched), a run interrupted with Ctrl-C and continued with --resume
#     (every case recorded exactly once);
#  3. optionally (FIXTURE=1) a selftest run with blocking, nvml and memcheck whose folder is
#     kept as a recorded real run (the report's test fixture).
# Logs go to $VERIFY_DIR (default /tmp/run-output), packed into $OUT/run-output.tgz.
# STEPS (default "noext build run1 resume") picks sections; FIXTURE=1 adds the self-test run.
set -u -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
D=${VERIFY_DIR:-/tmp/run-output}
rm -rf "$D"; mkdir -p "$D"
ARGS=(-m "not slow")
summary=()
say() { summary+=("$1"); echo "== $1"; }
gc() { "$PY" -m gpucheck.cli "$@"; }
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader | tee "$D/gpus.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'devices', torch.cuda.device_count())"

STEPS=${STEPS:-noext build run1 resume}
step() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# --- 1. no extension -----------------------------------------------------------------------
if step noext; then
rm -f gpucheck/_C*.so
GPUCHECK_NO_EXTENSION=1 "$PY" -m pip install -q --no-deps --no-build-isolation -e . \
  > "$D/install-noext.log" 2>&1 || { tail -20 "$D/install-noext.log"; exit 1; }
mkdir -p "$D/user/mine"
cat > "$D/user/mine/test_mine.py" <<'PY'
import torch
def test_user_op(gpu_device):
    x = torch.arange(10.0, device=gpu_device)
    assert float((x * 2).sum()) == 90.0
PY
( cd "$D/user" && gc run --all-devices --quiet --suite "$OLDPWD/suites/knn" \
    --suite "$OLDPWD/suites/ssim" > "$D/noext-default.out" 2> "$D/noext-default.err" )
rc=$?; made=$(ls "$D/user/reports" 2>/dev/null | wc -l)
say "no extension, knn+ssim: exit $rc, stderr lines $(wc -l < "$D/noext-default.err"), report folders $made"
cat "$D/noext-default.err"
gc run --all-devices --quiet --suite "$D/user/mine" --suite knn --out "$D/noext-mixed" \
  > "$D/noext-mixed.out" 2>&1
rc=$?; say "no extension, user suite + knn: exit $rc; $(grep -c '"record":"case"' "$D/noext-mixed/results.jsonl") case records"
grep -E "suite knn|case\(s\)" "$D/noext-mixed.out"
for s in knn ssim; do
  "$PY" -m pytest "suites/$s" -q -p no:cacheprovider --collect-only > "$D/noext-pytest-$s.log" 2>&1
  rc=$?; say "no extension, plain pytest suites/$s: exit $rc, $(grep -c 'CUDA extension is not available' "$D/noext-pytest-$s.log") message line(s)"
done
fi

# --- 2. with the extension ---------------------------------------------------------------------
if step build; then
s=$(date +%s)
"$PY" -m pip install -v --no-deps --no-build-isolation -e . > "$D/build.log" 2>&1 \
  && "$PY" -c "import torch, gpucheck._C" || { tail -40 "$D/build.log"; exit 1; }
say "build: $(( $(date +%s) - s )) s"
fi
if step run1; then
s=$(date +%s)
gc run --all-devices --quiet --suite knn --suite ssim --out "$D/run1" -- "${ARGS[@]}" > "$D/run1.out" 2>&1
rc=$?; say "run1 knn+ssim (not slow): exit $rc in $(( $(date +%s) - s )) s: $(tail -1 "$D/run1.out")"
"$PY" - "$D/run1/results.jsonl" <<'PY' | tee "$D/run1-findings.txt"
import collections, json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
kinds = collections.Counter(f["kind"] for r in recs if r.get("record") == "case" for f in r["findings"])
print(f"run1 findings by kind: {dict(kinds) or 'none'}")
PY
# what the worker-side detectors cost: warm runs (run1 paid the warm-up), off then on
for i in ${COST_RUNS:-3 4}; do
  s=$(date +%s)
  det=on; [ $(( i % 2 )) = 1 ] && det=off
  GPUCHECK_DISABLE_DETECTORS=$([ $det = off ] && echo all) gc run --all-devices --quiet --suite knn --suite ssim --out "$D/run$i" \
    -- "${ARGS[@]}" > "$D/run$i.out" 2>&1
  say "run$i (detectors $det): exit $? in $(( $(date +%s) - s )) s"
done
"$PY" - "$D" <<'PY' | tee "$D/overhead.txt"
import json, sys
def total(p):
    return sum(r["duration_s"] for r in map(json.loads, open(p)) if r.get("record") == "case")
import os
runs = [i for i in range(3, 9) if os.path.exists(f"{sys.argv[1]}/run{i}/results.jsonl")]
off = [total(f"{sys.argv[1]}/run{i}/results.jsonl") for i in runs if i % 2 == 1]
on = [total(f"{sys.argv[1]}/run{i}/results.jsonl") for i in runs if i % 2 == 0]
print(f"case time with detectors {on} s, without {off} s: "
      f"{100 * (sum(on) - sum(off)) / sum(off):+.1f} %")
PY
before=$(md5sum < "$D/run1/results.jsonl")
gc run --all-devices --quiet --suite knn --suite ssim --out "$D/run1" -- "${ARGS[@]}" > "$D/run1-again.out" 2>&1
rc=$?; after=$(md5sum < "$D/run1/results.jsonl")
say "same command, same --out: exit $rc, results.jsonl unchanged: $([ "$before" = "$after" ] && echo yes || echo NO)"
cat "$D/run1-again.out"
fi
if step resume; then
# interrupted (SIGTERM, what a cancelled CI job sends), then resumed
"$PY" -m gpucheck.cli run --all-devices --quiet --suite knn --out "$D/run2" -- "${ARGS[@]}" \
  > "$D/run2-part1.out" 2>&1 &
pid=$!
# (SIGINT would not do: bash starts background jobs with SIGINT ignored)
sleep "${INTERRUPT_AFTER:-8}"; kill -TERM "$pid"; wait "$pid"; rc=$?
n1=$(grep -c '"record":"case"' "$D/run2/results.jsonl")
say "run2 stopped by SIGTERM after ${INTERRUPT_AFTER:-8} s: exit $rc, $n1 case records; $(grep -o "\"reason\":\"stopped[^\"]*\"" "$D/run2/results.jsonl" | head -1)"
gc run --resume "$D/run2" --quiet > "$D/run2-resume.out" 2>&1; rc=$?
"$PY" - "$D/run2/results.jsonl" "$D/run1/results.jsonl" <<'PY' > "$D/run2-check.txt"
import collections, json, sys
def load(p):
    return [json.loads(l) for l in open(p) if l.strip()]
recs = load(sys.argv[1])
kinds = collections.Counter(r["record"] for r in recs)
cases = collections.Counter((r["device"], r["case"]) for r in recs if r["record"] == "case")
import os
ref = ({(r["device"], r["case"]) for r in load(sys.argv[2]) if r["record"] == "case" and r["suite"] == "knn"}
       if os.path.exists(sys.argv[2]) else set(cases))
print(f"records {dict(kinds)}; distinct cases {len(cases)}; recorded twice {sum(n > 1 for n in cases.values())}; "
      f"same cases as run1's knn: {set(cases) == ref}; run ids {len({r['run_id'] for r in recs})}")
PY
say "run2 resumed: exit $rc: $(cat "$D/run2-check.txt"): $(tail -1 "$D/run2-resume.out")"
fi

# --- 3. a recorded real run ----------------------------------------------------------------------
if [ "${FIXTURE:-0}" = 1 ]; then
  s=$(date +%s)
  gc run --all-devices --quiet --suite selftest --mode blocking --mode nvml \
    --mode sanitizer:memcheck --timeout 300 --out "$D/fixture" > "$D/fixture.out" 2>&1
  rc=$?; say "fixture run selftest blocking+nvml+memcheck: exit $rc in $(( $(date +%s) - s )) s: $(tail -1 "$D/fixture.out")"
  ls "$D/fixture"
fi
[ -n "${OUT:-}" ] && tar -C "$(dirname "$D")" -czf "$OUT/run-output.tgz" "$(basename "$D")"
printf '%s\n' "== summary" "${summary[@]}"
