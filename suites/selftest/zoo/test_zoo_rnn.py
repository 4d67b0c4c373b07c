"""The zoo's RWKV-shaped custom RNN (zoo_rnn.cpp / .cu) through its autograd Function,
against the recurrence in PyTorch, forward and backward. Builds ``gpucheck_zoo_rnn_<build>``:
``clean`` (the twin; the initial state a zero-element placeholder when not given) and
``legacy`` (both kernels on the legacy default stream, as RWKV's were); the last case hands the
initial state on the CPU (the extension copies it over: a mixed-device call, not a crash).
What each case must draw: ``gpucheck.selftest.ZOO``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
B, T, C = 2, 33, 48  # B * C a multiple of 32, as the kernels' launch needs


def _check(zoo_fn, ext, device, state):
    """``state``: None (placeholder), "cuda" (learned, on the device) or "cpu" (a slip: a
    constant state left on the CPU)."""
    inputs = [
        torch.randn(C) * 0.5 - 1,
        torch.randn(C) * 0.5,
        torch.randn(B, T, C) * 0.5,
        torch.randn(B, T, C) * 0.5,
    ]
    h0 = None if state is None else torch.randn(B, C) * 0.5
    leaves = [t.to(device).requires_grad_(True) for t in inputs]
    given = h0
    if state == "cuda":
        given = h0.to(device).requires_grad_(True)
        leaves.append(given)
    y = zoo_fn.wkv(ext, *leaves[:4], given)
    weights = torch.randn(B, T, C)
    y.backward(weights.to(device))

    refs = [t.detach().double().requires_grad_(True) for t in inputs]
    ref_h0 = None if h0 is None else h0.detach().double().requires_grad_(state == "cuda")
    ref = zoo_fn.wkv_reference(*refs, ref_h0)
    (ref * weights.double()).sum().backward()
    if state == "cuda":
        refs.append(ref_h0)
    torch.testing.assert_close(y.detach().double().cpu(), ref.detach(), rtol=1e-4, atol=1e-4)
    for leaf, r in zip(leaves, refs, strict=True):
        torch.testing.assert_close(leaf.grad.double().cpu(), r.grad, rtol=1e-3, atol=1e-3)


def test_rnn_clean(zoo_ext, zoo_fn, gpu_device):
    _check(zoo_fn, zoo_ext("rnn_clean"), gpu_device, "cuda")


def test_rnn_clean_placeholder(zoo_ext, zoo_fn, gpu_device):
    _check(zoo_fn, zoo_ext("rnn_clean"), gpu_device, None)


def test_rnn_legacy(zoo_ext, zoo_fn, gpu_device):
    _check(zoo_fn, zoo_ext("rnn_legacy"), gpu_device, None)


def test_rnn_noguard_legacy(zoo_ext, zoo_fn, gpu_device):
    # no guard and both kernels on stream 0 (RWKV's first kernels): on two GPUs the case
    # faults with the other device current; its re-run with its own device current passes
    # and sees the stream-0 launches
    _check(zoo_fn, zoo_ext("rnn_noguard_legacy"), gpu_device, None)


def test_rnn_legacy_cpu_state(zoo_ext, zoo_fn, gpu_device):
    _check(zoo_fn, zoo_ext("rnn_legacy"), gpu_device, "cpu")
