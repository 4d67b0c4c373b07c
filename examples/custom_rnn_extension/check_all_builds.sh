#!/usr/bin/env bash
# Build the example clean and with each defect (JIT, in parallel), then check every build with
# `gpucheck run --all-devices` and with plain `pytest -n $NPROC`; logs and run folders go to
# ${OUT:-./check-logs}/ and a summary of the findings per build is printed at the end.
# Run from a gpucheck checkout with gpucheck installed: bash examples/custom_rnn_extension/check_all_builds.sh
set -u
EX="$(cd "$(dirname "$0")" && pwd)"
LOGS="${OUT:-$PWD/check-logs}/logs"
NPROC="${NPROC:-$(python3 -c 'import torch; print(max(1, torch.cuda.device_count()))')}"
BUILDS=(clean no_guard bf16_accum grad_current_device)
export PYTHONPATH="$EX${PYTHONPATH:+:$PYTHONPATH}" TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}"
mkdir -p "$LOGS"
defect() { [ "$1" = clean ] && echo "" || echo "$1"; }

for b in "${BUILDS[@]}"; do
  (CUSTOM_RNN_DEFECT=$(defect "$b") python3 -c "import custom_rnn" >"$LOGS/build_$b.log" 2>&1
   echo "exit $?" >>"$LOGS/build_$b.log") &
done
wait
for b in "${BUILDS[@]}"; do
  (CUSTOM_RNN_DEFECT=$(defect "$b") gpucheck run --all-devices --quiet --suite "$EX/tests/test_wkv.py" \
     --out "$LOGS/run_$b" >"$LOGS/run_$b.log" 2>&1; echo "exit $?" >>"$LOGS/run_$b.log") &
done
wait
for b in "${BUILDS[@]}"; do
  (CUSTOM_RNN_DEFECT=$(defect "$b") python3 -m pytest -q -p no:cacheprovider -n "$NPROC" -rs \
     "$EX/tests/test_wkv.py" >"$LOGS/xdist_$b.log" 2>&1; echo "exit $?" >>"$LOGS/xdist_$b.log") &
done
wait

python3 - "$LOGS" "${BUILDS[@]}" <<'PY'
import json, re, sys
from pathlib import Path
logs, builds = Path(sys.argv[1]), sys.argv[2:]
for b in builds:
    print(f"=== {b}: build {(logs / f'build_{b}.log').read_text().strip().splitlines()[-1]}")
    res = logs / f"run_{b}" / "results.jsonl"
    run_log = (logs / f"run_{b}.log").read_text().strip().splitlines()
    print("  gpucheck run:", " | ".join(run_log[-2:]))
    if res.exists():
        for line in res.read_text().splitlines():
            r = json.loads(line)
            if r.get("record") != "case":
                continue
            for f in r.get("findings") or []:
                print(f"    {r['device']} {r['case'].split('::')[-1]} {r['status']}: "
                      f"{f['kind']}/{f['severity']} op={f.get('op')} {f['message'][:160]!r}")
    text = (logs / f"xdist_{b}.log").read_text()
    tail = [l for l in text.splitlines() if re.search(r"passed|failed|skipped|^exit", l)][-2:]
    print("  pytest -n:", " | ".join(tail))
    if "gpucheck findings" in text:
        sect = text.split("gpucheck findings", 1)[1].splitlines()[1:]
        for l in sect:
            if l.startswith("=") or l.startswith("FAILED") or l.startswith("SKIPPED"):
                break
            if not l.startswith("    hint"):
                print("    " + l[:220])
PY
