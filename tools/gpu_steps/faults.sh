#!/usr/bin/env bash
# faults on the GPU (issue 30, rows 1 and 2): a worker SIGKILLed mid-case; gpucheck run SIGKILLed mid-run, its workers gone, then --resume
# On the knn suite (-m "not slow"), after the install step; each kill comes once 20 cases are
# recorded. Each part checks what the promise says: the killed case is `crashed` (SIGKILL)
# and the run goes on; after the parent's SIGKILL no worker is left and no record is added;
# the resume records every case exactly once.
D=$S
ARGS=(-m "not slow")
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
cases_in() { local n; n=$(grep -c '"record":"case"' "$1" 2>/dev/null); echo "${n:-0}"; }
# --- row 1: one worker SIGKILLed mid-case (as the OOM killer does) ---------------------------
# (the python process itself in the background, not the gc function: $! must be gpucheck's)
"$PY" -m gpucheck.cli run "${ALL[@]}" --quiet --suite knn --out "$D/row1" -- "${ARGS[@]}" \
  >"$D/row1.out" 2>&1 &
run=$!
for _ in $(seq 600); do  # mid-run: once 20 cases are recorded
  [ "$(cases_in "$D/row1/results.jsonl")" -ge 20 ] && break; sleep 0.1
done
victim=$(pgrep -f -- "--gpucheck-results $D/row1/results.jsonl" | head -1)
[ -n "$victim" ] && kill -KILL "$victim"
wait "$run"; rc=$?
note "row 1: worker $victim SIGKILLed after 20 case records: exit $rc (1: the crash is a finding): $(check "$D/row1/results.jsonl")"
# --- row 2: the parent SIGKILLed mid-run, then --resume --------------------------------------
"$PY" -m gpucheck.cli run "${ALL[@]}" --quiet --suite knn --out "$D/row2" -- "${ARGS[@]}" \
  >"$D/row2.out" 2>&1 &
run=$!
for _ in $(seq 600); do
  [ "$(cases_in "$D/row2/results.jsonl")" -ge 20 ] && break; sleep 0.1
done
kill -KILL "$run"; wait "$run" 2>/dev/null
sleep 3
left=$(pgrep -fc -- "--gpucheck-results $D/row2/results.jsonl" || true)
n1=$(grep -c '"record":"case"' "$D/row2/results.jsonl")
sleep 5
n2=$(grep -c '"record":"case"' "$D/row2/results.jsonl")
note "row 2: parent SIGKILLed after 20 case records: workers left after 3 s: ${left:-0}; case records $n1, 5 s later $n2"
gc run --resume "$D/row2" --quiet >"$D/row2-resume.out" 2>&1; rc=$?
note "row 2: --resume: exit $rc: $(check "$D/row2/results.jsonl")"
true
