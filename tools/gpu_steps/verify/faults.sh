#!/usr/bin/env bash
# faults on the GPU, each against its promise in docs/faults.md (FAULT_ROWS): 1, 2 (worker / gpucheck run SIGKILLed, --resume), 7 (two runs on GPU 0), 9 (NVML failing mid-run), 10 (compute-sanitizer missing, crashing)
# On the knn suite, after the install step; FAULT_ROWS picks the rows (default "1 2 7 9 10";
# "7 9 10" fits with install in one 10-minute call). Each row checks its promise (docs/faults.md)
# and the step ends with a table: row, fault, exit codes, what was seen, as expected or not.
#   1: a worker SIGKILLed once 20 cases are recorded: that case `crashed` (SIGKILL), the run
#      goes on; 2: gpucheck run SIGKILLed: no worker left, no record added, --resume records
#      every case once;
#   7: a second run on GPU 0 while one runs: refused in one line naming the first (exit 2, no
#      folder); a third with --wait-for-devices waits, then runs once the first has ended;
#   9: NVML failing under a mode-nvml run (the shim of tests/fixtures/faults/nvml_shim.c in
#      front of the real libnvidia-ml, failing once a file exists, after 20 cases): the cases
#      after it have no NVML peak and an nvml-error warning, the run a note, nothing fails;
#  10: compute-sanitizer not on PATH nor in $CUDA_HOME: one line, exit 2, no folder; a
#      compute-sanitizer that kills itself (SIGSEGV) once its worker is inside a case: that
#      case is a sanitizer-crash error, the tool's worker is gone, a fresh tool runs the rest.
D=$S
ROWS=" ${FAULT_ROWS:-1 2 7 9 10} "
ARGS=(-m "not slow")
PYABS=$(command -v "$PY")
want() { [[ "$ROWS" == *" $1 "* ]]; }
table=()
row() { table+=("$(printf '%-4s %-44s %-9s %s' "$1" "$2" "$3" "$4")"); note "row $1: $2: exit $3: $4"; }
cases_in() { local n; n=$(grep -c '"record":"case"' "$1" 2>/dev/null); echo "${n:-0}"; }
wait_cases() {  # results.jsonl, count, pid: until that many case records, the run ended, 120 s
  for _ in $(seq 1200); do
    [ "$(cases_in "$1")" -ge "$2" ] && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
check() {  # results.jsonl -> counts of records, cases recorded twice, statuses
  "$PY" - "$1" <<'PY'
import collections, json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
kinds = collections.Counter(r["record"] for r in recs)
cases = collections.Counter((r["device"], r["case"], r["mode"]) for r in recs
                            if r["record"] == "case")
status = collections.Counter(r["status"] for r in recs if r["record"] == "case")
killed = [(r["case"], r.get("signal")) for r in recs
          if r["record"] == "case" and r["status"] == "crashed"]
print(f"records {dict(kinds)}; cases {len(cases)}, recorded twice "
      f"{sum(n > 1 for n in cases.values())}; status {dict(status)}; crashed {killed[:3]}")
PY
}

# --- row 1: one worker SIGKILLed mid-case (as the OOM killer does) ---------------------------
if want 1; then
# (the python process itself in the background, not the gc function: $! must be gpucheck's)
"$PY" -m gpucheck.cli run "${ALL[@]}" --quiet --suite knn --out "$D/row1" -- "${ARGS[@]}" \
  >"$D/row1.out" 2>&1 &
run=$!
wait_cases "$D/row1/results.jsonl" 20 "$run"
victim=$(pgrep -f -- "--gpucheck-results $D/row1/results.jsonl" | head -1)
[ -n "$victim" ] && kill -KILL "$victim"
wait "$run"; rc=$?
row 1 "worker SIGKILLed after 20 case records" "$rc" "$(check "$D/row1/results.jsonl")"
fi

# --- row 2: the parent SIGKILLed mid-run, then --resume --------------------------------------
if want 2; then
"$PY" -m gpucheck.cli run "${ALL[@]}" --quiet --suite knn --out "$D/row2" -- "${ARGS[@]}" \
  >"$D/row2.out" 2>&1 &
run=$!
wait_cases "$D/row2/results.jsonl" 20 "$run"
kill -KILL "$run"; wait "$run" 2>/dev/null
sleep 3
left=$(pgrep -fc -- "--gpucheck-results $D/row2/results.jsonl" || true)
n1=$(cases_in "$D/row2/results.jsonl")
sleep 5
n2=$(cases_in "$D/row2/results.jsonl")
gc run --resume "$D/row2" --quiet >"$D/row2-resume.out" 2>&1; rc=$?
row 2 "gpucheck run SIGKILLed, then --resume" "137/$rc" \
  "workers left after 3 s: ${left:-0}; case records $n1, 5 s later $n2; resume: $(check "$D/row2/results.jsonl")"
fi

# --- row 7: a second and a third gpucheck run on GPU 0 while one runs -------------------------
if want 7; then
"$PY" -m gpucheck.cli run --device 0 --quiet --suite knn --out "$D/row7-first" -- "${ARGS[@]}" \
  >"$D/row7-first.out" 2>&1 &
first=$!
for _ in $(seq 1200); do
  { [ -s "$D/row7-first/results.jsonl" ] || ! kill -0 "$first" 2>/dev/null; } && break
  sleep 0.1
done
"$PY" -m gpucheck.cli run --device 0 --quiet --suite knn --out "$D/row7-second" \
  -- -k every_k >"$D/row7-second.out" 2>&1
rc2=$?
timeout -k 30 600 "$PY" -m gpucheck.cli run --device 0 --quiet --suite knn \
  --out "$D/row7-queued" --wait-for-devices 600 -- -k every_k >"$D/row7-queued.out" 2>&1 &
queued=$!
wait "$first"; rc1=$?
wait "$queued"; rc3=$?
seen=$("$PY" - "$D" "$first" <<'PY'
import json, os, sys
from datetime import datetime
d, first = sys.argv[1], sys.argv[2]
said = [l for l in open(f"{d}/row7-second.out") if l.startswith("gpucheck: ")]
ok_refused = (len(said) == 1 and f"pid {first} " in said[0] and "row7-first" in said[0]
              and not os.path.exists(f"{d}/row7-second"))
waited = any(l.startswith("gpucheck: waiting up to 600 s for cuda:0")
             for l in open(f"{d}/row7-queued.out"))
def recs(p):
    return [json.loads(l) for l in open(f"{d}/{p}/results.jsonl") if l.strip()]
end = [r for r in recs("row7-first") if r["record"] == "end"]
head = recs("row7-queued")[0] if os.path.exists(f"{d}/row7-queued/results.jsonl") else {}
after = bool(end and head) and (datetime.fromisoformat(head["started_at"])
                                >= datetime.fromisoformat(end[0]["finished_at"]))
print(f"second refused in one line naming the first: {'yes' if ok_refused else 'NO'} "
      f"({said[0].strip()[:160] if said else 'no gpucheck: line'}...); third waited: "
      f"{'yes' if waited else 'NO'}, started after the first ended: {'yes' if after else 'NO'}")
PY
)
row 7 "a 2nd and a 3rd run on GPU 0 during one" "$rc1/$rc2/$rc3" "$seen"
fi

# --- row 9: NVML failing mid-run ---------------------------------------------------------------
if want 9; then
mkdir -p "$D/shim"
real=$("$PY" -c "import ctypes; ctypes.CDLL('libnvidia-ml.so.1'); print(next(l.split()[-1]
for l in open('/proc/self/maps') if 'libnvidia-ml' in l))" 2>/dev/null)
if ! ${CC:-cc} -shared -fPIC -o "$D/shim/libnvidia-ml.so.1" "$ROOT/tests/fixtures/faults/nvml_shim.c" \
    -ldl 2>"$D/shim/build.log" || [ -z "$real" ]; then
  row 9 "NVML failing mid-run" "-" "NOT RUN: shim build failed or no libnvidia-ml ($(tail -1 "$D/shim/build.log"))"
else
  LD_LIBRARY_PATH="$D/shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" GPUCHECK_SHIM_NVML_REAL="$real" \
    GPUCHECK_SHIM_NVML_FAIL="$D/nvml-broken" timeout -k 30 600 "$PY" -m gpucheck.cli run \
    --device 0 --quiet --mode nvml --suite knn --out "$D/row9" -- "${ARGS[@]}" \
    >"$D/row9.out" 2>&1 &
  run=$!
  wait_cases "$D/row9/results.jsonl" 20 "$run"
  touch "$D/nvml-broken"  # from now on every NVML query fails (NVML_ERROR_UNKNOWN)
  wait "$run"; rc=$?
  seen=$("$PY" - "$D/row9/results.jsonl" "$D/row9.out" <<'PY'
import collections, json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip() and '"record":"case"' in l]
warned = [r for r in recs if any(f["kind"] == "nvml-error" for f in r["findings"])]
peaks = [r for r in recs if (r.get("memory") or {}).get("nvml_peak_used")]
status = collections.Counter(r["status"] for r in recs)
note = [l.strip() for l in open(sys.argv[2]) if "NVML failed in" in l]
ok = (warned and peaks and all(r["memory"].get("nvml_peak_used") is None for r in warned)
      and not status.get("failed") and not status.get("error") and note)
print(f"{'as expected' if ok else 'NOT AS EXPECTED'}: {len(peaks)} cases with an NVML peak, "
      f"then {len(warned)} with nvml-error (peak None); status {dict(status)}; "
      f"{note[0][:150] if note else 'no note'}")
PY
)
  row 9 "NVML failing after 20 cases (shim)" "$rc" "$seen"
fi
fi

# --- row 10: compute-sanitizer missing, or crashing itself -------------------------------------
if want 10; then
mkdir -p "$D/nobin" "$D/nocuda" "$D/fakebin"
PATH="$D/nobin" CUDA_HOME="$D/nocuda" CUDA_PATH="" "$PYABS" -m gpucheck.cli run --device 0 \
  --quiet --mode sanitizer:memcheck --suite knn --out "$D/row10-missing" >"$D/row10-missing.out" 2>&1
rc=$?
said=$(grep -c "^gpucheck: compute-sanitizer was not found" "$D/row10-missing.out")
lines=$(grep -c . "$D/row10-missing.out")
folder=$([ -e "$D/row10-missing" ] && echo "made" || echo "none")
row 10a "compute-sanitizer missing (PATH, CUDA_HOME)" "$rc" \
  "$([ "$rc" = 2 ] && [ "$said" = 1 ] && [ "$lines" = 1 ] && [ "$folder" = none ] && echo "as expected" || echo "NOT AS EXPECTED"): $lines line(s), run folder $folder: $(head -c 200 "$D/row10-missing.out")"
real=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" 2>/dev/null)
if [ -z "$real" ]; then
  row 10b "compute-sanitizer crashing mid-case" "-" "NOT RUN: no compute-sanitizer here"
else
  # stands in for compute-sanitizer: runs the real one and, the first time, kills itself once
  # the worker under it is inside a case (its state file names one), leaving the real tool and
  # the worker behind, as a crashing tool would
  cat >"$D/fakebin/compute-sanitizer" <<EOF
#!/usr/bin/env bash
state=""; prev=""
for a in "\$@"; do [ "\$prev" = "--gpucheck-state" ] && state=\$a; prev=\$a; done
[ -e "$D/tool-crashed" ] && exec "$real" "\$@"
"$real" "\$@" &
tool=\$!
echo "\$tool" >"$D/tool.pid"
while kill -0 "\$tool" 2>/dev/null; do
  if grep -q '"case": "' "\$state" 2>/dev/null; then
    touch "$D/tool-crashed"
    echo "fake compute-sanitizer: crashing (SIGSEGV) while a case runs" >&2
    kill -SEGV \$\$
  fi
  sleep 0.2
done
wait "\$tool"
EOF
  chmod +x "$D/fakebin/compute-sanitizer"
  PATH="$D/fakebin:$PATH" timeout -k 30 600 "$PY" -m gpucheck.cli run --device 0 --quiet \
    --mode sanitizer:memcheck --suite knn --out "$D/row10-crash" \
    -- -k "duplicates or all_points_equal or bitwise_repeatable or side_stream" \
    >"$D/row10-crash.out" 2>&1
  rc=$?
  sleep 2
  tool_left=$([ -s "$D/tool.pid" ] && kill -0 "$(cat "$D/tool.pid")" 2>/dev/null && echo yes || echo no)
  workers_left=$(pgrep -fc -- "--gpucheck-results $D/row10-crash/results.jsonl" || true)
  seen=$("$PY" - "$D/row10-crash/results.jsonl" <<'PY'
import collections, json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip() and '"record":"case"' in l]
crash = [r for r in recs if any(f["kind"] == "sanitizer-crash" for f in r["findings"])]
status = collections.Counter(r["status"] for r in recs)
ok = (len(crash) == 1 and crash[0]["status"] == "error" and status.get("passed", 0) >= 1
      and len(recs) == len({r["case"] for r in recs}))
print(f"{'as expected' if ok else 'NOT AS EXPECTED'}: status {dict(status)}; "
      + (f"{crash[0]['case'].split('::')[-1]}: {crash[0]['reason'][:140]}" if crash
         else "no sanitizer-crash record"))
PY
)
  row 10b "compute-sanitizer SIGSEGV mid-case" "$rc" \
    "$seen; real tool left: $tool_left, workers left: ${workers_left:-0}"
fi
fi

echo
printf '%-4s %-44s %-9s %s\n' row fault exit "what was seen"
[ "${#table[@]}" -gt 0 ] && printf '%s\n' "${table[@]}"
true
