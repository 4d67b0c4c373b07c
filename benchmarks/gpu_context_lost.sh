#!/usr/bin/env bash
# A real sticky CUDA error (a device-side assert: an index out of bounds) in a suite of plain
# tests and check_op lines, run three ways on one GPU: plain pytest, pytest -n 1 and
# gpucheck run --all-devices. After the fault, pytest's later CUDA tests must say "not run:
# ... context was lost in <test>" (not fail blaming other ops); gpucheck run goes on in a
# fresh worker where they pass. Usage: OUT=/dir bash benchmarks/gpu_context_lost.sh
set -uo pipefail
FINAL=${OUT:-/tmp/gpucheck-lost}
WORK=$(mktemp -d)
mkdir -p "$FINAL"
export PYTHONUNBUFFERED=1
GPUCHECK_NO_EXTENSION=1 python3 -m pip install -q --no-deps --no-build-isolation -e . \
  >"$WORK/install.log" 2>&1 || { tail -20 "$WORK/install.log"; exit 1; }
mkdir -p "$WORK/suite"
cat >"$WORK/suite/test_lost.py" <<'PY'
import torch

import gpucheck


def boom(x):
    """Reads one element past the end through a CUDA index tensor: a device-side assert."""
    return x[torch.full((1,), x.numel() + 7, device=x.device, dtype=torch.long)] * x.sum()


def fine(x):
    if x.dtype != torch.float32:
        raise TypeError(f"fine: x must be float32, got {x.dtype}")
    return torch.sin(x) * 2


def make_inputs(device, dtype):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(4096, generator=g, dtype=torch.float64).to(device, dtype),)


test_0_boom_op = gpucheck.check_op(boom, make_inputs, lambda x: x[:1] * x.sum(),
                                   dtypes=("float32",), backward=False)


def test_1_fault(gpu_device):
    x = torch.randn(64, device=gpu_device)
    boom(x)
    torch.cuda.synchronize(gpu_device)


def test_2_after(gpu_device):
    assert torch.ones(4, device=gpu_device).sum().item() == 4


test_3_fine_op = gpucheck.check_op(fine, make_inputs, lambda x: torch.sin(x) * 2,
                                   dtypes=("float32",))
PY
cd "$WORK/suite"
( time python3 -m pytest -p no:cacheprovider -q test_lost.py ) >"$WORK/plain.log" 2>&1
echo "plain pytest rc=$?"
( time python3 -m pytest -p no:cacheprovider -q -n 1 test_lost.py ) >"$WORK/xdist.log" 2>&1
echo "pytest -n 1 rc=$?"
( time python3 -m gpucheck.cli run --all-devices --suite test_lost.py --quiet --out "$WORK/run" ) \
  >"$WORK/run.log" 2>&1
echo "gpucheck run rc=$?"
cd - >/dev/null
tar czf "$FINAL/context_lost.tgz" -C "$WORK" plain.log xdist.log run.log run suite 2>/dev/null
for f in plain xdist; do
  echo "== $f: outcome lines"; grep -E "passed|failed|error" "$WORK/$f.log" | tail -3
  grep -E "^(FAILED|ERROR) |lost its process|^(ERROR|WARNING) [a-z-]+ \[" "$WORK/$f.log" \
    | cut -c1-230 | head -24
done
echo "== gpucheck run"; tail -3 "$WORK/run.log"
python3 - "$WORK/run/results.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("record") in ("case", "diagnosis", "crash"):
        print(r.get("record"), r.get("case", "")[:60], r.get("status"),
              [(f["kind"], f.get("op"), f["message"][:90]) for f in r.get("findings", [])][:2])
PY
