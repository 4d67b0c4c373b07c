#!/usr/bin/env bash
# can a run's output be trusted: same --out refused, SIGTERM then --resume, each case once
# Parts (RUN_OUTPUT_STEPS, default "run1 resume"), after the install step:
#  run1    knn + ssim (-m "not slow"), warm runs with the worker detectors off and on
#          (COST_RUNS), the same command again into the same --out (refused, the first results
#          untouched);
#  resume  a knn run stopped by SIGTERM after INTERRUPT_AFTER s (default 8), continued with
#          --resume (every case recorded exactly once).
# (The "no extension" part of the script this came from, benchmarks/verify_run_output.sh, is
# gone: a missing extension is now built on first use where nvcc exists, as on the
# GPU machine; tests/ cover the message where it cannot be built.)
# FIXTURE=1 adds a selftest run with blocking, nvml and memcheck kept as a recorded real run.
D=$S
ARGS=(-m "not slow")
say() { note "$1"; }
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader | tee "$D/gpus.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'devices', torch.cuda.device_count())"

STEPS=${RUN_OUTPUT_STEPS:-run1 resume}
step() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# --- a run, the same command into the same --out, detector cost -------------------------------
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

# --- a recorded real run ----------------------------------------------------------------------
if [ "${FIXTURE:-0}" = 1 ]; then
  s=$(date +%s)
  gc run --all-devices --quiet --suite selftest --mode blocking --mode nvml \
    --mode sanitizer:memcheck --timeout 300 --out "$D/fixture" > "$D/fixture.out" 2>&1
  rc=$?; say "fixture run selftest blocking+nvml+memcheck: exit $rc in $(( $(date +%s) - s )) s: $(tail -1 "$D/fixture.out")"
  ls "$D/fixture"
fi
true
