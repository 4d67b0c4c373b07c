#!/usr/bin/env bash
# a real sticky CUDA error (device-side assert) in a suite: plain pytest, pytest -n 1 and gpucheck run after it
# After the fault, pytest's later CUDA tests must say "not run: ... context was lost in <test>"
# (not fail blaming other ops); gpucheck run goes on in a fresh worker where they pass. Needs
# gpucheck importable (the install step; the kernels are not used).
WORK=$S
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
( time "$PY" -m pytest -p no:cacheprovider -q test_lost.py ) >"$WORK/plain.log" 2>&1
note "context-lost: plain pytest rc=$?"
( time "$PY" -m pytest -p no:cacheprovider -q -n 1 test_lost.py ) >"$WORK/xdist.log" 2>&1
note "context-lost: pytest -n 1 rc=$?"
( time "$PY" -m gpucheck.cli run --all-devices --suite test_lost.py --quiet --out "$WORK/run" ) \
  >"$WORK/run.log" 2>&1
note "context-lost: gpucheck run rc=$?"
cd "$ROOT" || exit 1
for f in plain xdist; do
  echo "== $f: outcome lines"; grep -E "passed|failed|error" "$WORK/$f.log" | tail -3
  grep -E "^(FAILED|ERROR) |lost its process|^(ERROR|WARNING) [a-z-]+ \[" "$WORK/$f.log" \
    | cut -c1-230 | head -24
done
echo "== gpucheck run"; tail -3 "$WORK/run.log"
"$PY" - "$WORK/run/results.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("record") in ("case", "diagnosis", "crash"):
        print(r.get("record"), r.get("case", "")[:60], r.get("status"),
              [(f["kind"], f.get("op"), f["message"][:90]) for f in r.get("findings", [])][:2])
PY
