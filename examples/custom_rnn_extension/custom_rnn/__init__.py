"""A WKV-style linear recurrence as a CUDA extension: gpucheck's worked example.

Per (batch, channel) of ``k, v: [B, T, C]`` with ``w, u: [C]`` (``w`` in (0, 1]: decay)::

    y[t] = s[t-1] + u * k[t] * v[t]        s[t] = w * s[t-1] + k[t] * v[t]        s[-1] = 0

float32, float64 and bfloat16 (accumulating in float32). The same C++ entry points are
exposed twice: as torch ops (``torch.ops.custom_rnn.wkv`` / ``wkv_backward``, autograd
registered below) and as a pybind11 module (:func:`wkv_pybind` wraps it in an
``autograd.Function``). Build it with ``pip install --no-build-isolation -e .`` or let
:func:`load` JIT-compile it; ``CUSTOM_RNN_DEFECT`` (see :data:`DEFECTS`) plants a defect.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
CSRC = HERE.parent / "csrc"
DEFECT_ENV = "CUSTOM_RNN_DEFECT"
#: defect name -> the macro that plants it (csrc/wkv.h)
DEFECTS = {  # name -> macro: CUSTOM_RNN_DEFECT_<NAME> (setup.py uses the same rule)
    "no_guard": "CUSTOM_RNN_DEFECT_NO_GUARD",
    "bf16_accum": "CUSTOM_RNN_DEFECT_BF16_ACCUM",
    "grad_current_device": "CUSTOM_RNN_DEFECT_GRAD_CURRENT_DEVICE",
}


def defect() -> str | None:
    """The defect asked for in ``$CUSTOM_RNN_DEFECT`` (None: the clean build)."""
    name = os.environ.get(DEFECT_ENV) or None
    if name is not None and name not in DEFECTS:
        raise ValueError(f"{DEFECT_ENV}={name!r}: known defects are {', '.join(DEFECTS)}")
    return name


def flags(name: str | None) -> list[str]:
    return [] if name is None else [f"-D{DEFECTS[name]}"]


def load(verbose: bool = False) -> ModuleType:
    """The compiled module: ``custom_rnn._C`` when installed with setup.py (its defect was
    chosen at build time), else a JIT build (torch caches it by name) of ``$CUSTOM_RNN_DEFECT``."""
    name = defect()
    try:
        from custom_rnn import _C  # type: ignore[attr-defined]

        if getattr(_C, "DEFECT", None) == (name or ""):
            return _C
    except ImportError:
        pass
    from torch.utils import cpp_extension

    return cpp_extension.load(
        name=f"custom_rnn_{name or 'clean'}",
        sources=[str(CSRC / f) for f in ("bindings.cpp", "wkv.cpp", "wkv_cuda.cu")],
        extra_cflags=["-O3", *flags(name)],
        extra_cuda_cflags=["-O3", "-lineinfo", *flags(name)],
        verbose=verbose,
    )


_C = load()


# --- the torch op's autograd and fake (meta) implementations ------------------------------


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx: Any, gy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(torch.ops.custom_rnn.wkv_backward(*ctx.saved_tensors, gy.contiguous()))


torch.library.register_autograd("custom_rnn::wkv", _backward, setup_context=_setup_context)


@torch.library.register_fake("custom_rnn::wkv")
def _wkv_fake(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(k)


@torch.library.register_fake("custom_rnn::wkv_backward")
def _wkv_backward_fake(
    w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gy: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    return (torch.empty_like(w), torch.empty_like(u), torch.empty_like(k), torch.empty_like(v))


# --- the pybind11 functions, with autograd ------------------------------------------------


class _WKV(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(w, u, k, v)
        return _C.forward(w, u, k, v)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(_C.backward(*ctx.saved_tensors, gy.contiguous()))


def wkv_pybind(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``y = wkv(w, u, k, v)`` through the pybind11 module (differentiable)."""
    return _WKV.apply(w, u, k, v)


# --- what a suite needs: inputs and pure-PyTorch references -------------------------------

B, T, C = 3, 97, 67  # not multiples of anything the kernel tiles by


def make_inputs(device: Any, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """``(w, u, k, v)``: decays in (0.9, 1] (long memory: accumulation errors add up)."""
    w = 1 - 0.1 * torch.rand(C, device=device, dtype=torch.float64)
    u = torch.randn(C, device=device, dtype=torch.float64)
    k = torch.randn(B, T, C, device=device, dtype=torch.float64)
    v = torch.randn(B, T, C, device=device, dtype=torch.float64)
    return tuple(t.to(dtype) for t in (w, u, k, v))


def make_backward_inputs(device: Any, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """``(w, u, k, v, gy)`` for the backward op."""
    gy = torch.randn(B, T, C, device=device, dtype=torch.float64).to(dtype)
    return (*make_inputs(device, dtype), gy)


def reference(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The recurrence in plain PyTorch, accumulating in at least float32 like the kernel
    claims to (float64 stays float64); the result in the inputs' dtype."""
    acc = torch.promote_types(k.dtype, torch.float32)
    w_, u_, k_, v_ = (t.to(acc) for t in (w, u, k, v))
    kv = k_ * v_
    s = torch.zeros_like(kv[:, 0])
    ys = []
    for t in range(kv.shape[1]):
        ys.append(s + u_ * kv[:, t])
        s = w_ * s + kv[:, t]
    return torch.stack(ys, 1).to(k.dtype)


def backward_reference(
    w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gy: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """``(dw, du, dk, dv)`` of :func:`reference` for the output gradient ``gy``."""
    with torch.enable_grad():
        inputs = [t.detach().requires_grad_() for t in (w, u, k, v)]
        return torch.autograd.grad(reference(*inputs), inputs, gy)
