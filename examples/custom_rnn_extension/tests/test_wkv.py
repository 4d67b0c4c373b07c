"""gpucheck's standard battery on the WKV recurrence: the torch op, the same kernels as a
pybind11 function, and the backward op called on its own (inside autograd the engine makes
the gradient's device current, which would hide a gradient allocated on the current device).
Run: ``gpucheck run --all-devices --suite tests/test_wkv.py`` or ``pytest -n 2 tests``."""

import custom_rnn as rnn
import torch

import gpucheck

DTYPES = ("float32", "bfloat16", "float64")
# measured (measure_float32_tolerance.py): dw sums B*T terms of ~1e4, float32 leaves ~3e-4
TOL = {"rtol": {"float32": 1e-4}, "atol": {"float32": 2e-3}}

test_wkv_op = gpucheck.check_op(
    torch.ops.custom_rnn.wkv, rnn.make_inputs, rnn.reference, dtypes=DTYPES, **TOL
)
test_wkv_pybind = gpucheck.check_op(
    rnn.wkv_pybind, rnn.make_inputs, rnn.reference, dtypes=DTYPES, **TOL
)
test_wkv_backward_op = gpucheck.check_op(
    torch.ops.custom_rnn.wkv_backward,
    rnn.make_backward_inputs,
    rnn.backward_reference,
    dtypes=DTYPES,
    backward=False,
    **TOL,
)
