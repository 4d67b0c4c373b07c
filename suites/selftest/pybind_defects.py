"""The self-test's pybind11 extension (pybind_defects.cpp / .cu) as its users call it: from a
``torch.autograd.Function``, the way the 3DGS rasterizers call their ``_C`` module.

The extension is a ``PYBIND11_MODULE`` (not ``torch.ops``): its functions are seen per call
only through gpucheck's watch of compiled extension modules (``gpucheck.detectors.
ext_watch``). Builds: ``gpucheck._csrc.pybind.build_pybind("clean")`` and one per defect of
``gpucheck._csrc.pybind.PYBIND_DEFECTS``.

The defect builds launch on stream 0, unordered with the caller's (non-default) stream: each
call is bracketed by ``torch.cuda.synchronize`` here so that the result is right anyway (as
it is under ``CUDA_LAUNCH_BLOCKING=1``). The detectors look at streams, not at results.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch


def _ready(*tensors: torch.Tensor) -> None:
    for device in {t.device for t in tensors if t.is_cuda}:
        torch.cuda.synchronize(device)


class Scale(torch.autograd.Function):
    """``y = x * w[0]`` through the extension's ``scale_forward`` / ``scale_backward``."""

    @staticmethod
    def forward(ctx: Any, ext: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.ext = ext
        ctx.save_for_backward(x, w)
        _ready(x, w)
        y = ext.scale_forward(x, w)
        _ready(x, y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        grad = grad.contiguous()
        _ready(grad)
        grad_x, grad_w = ctx.ext.scale_backward(grad, x, w)
        _ready(grad_x, grad_w)
        return None, grad_x, grad_w


def scale(ext: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x * w[0]`` (``x``: [N] float32, ``w``: [1] float32), differentiable."""
    return Scale.apply(ext, x, w)  # type: ignore[no-any-return]


def shade(ext: Any, x: torch.Tensor, bg: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """``(x + bg) * gain`` (``x``: [N, C], ``bg``: [C], ``gain``: 0-dim on any device)."""
    _ready(x)
    out = ext.shade(x, bg, gain)
    _ready(out)
    return out  # type: ignore[no-any-return]


def raw_scale(ext: Any, x: torch.Tensor, w: torch.Tensor, stream: int | None) -> torch.Tensor:
    """``x * w[0]`` through the extension's C entry point, called with ``ctypes`` (a caller
    the per-call watch never sees) on ``stream`` (a ``cudaStream_t``; None: stream 0)."""
    fn = ctypes.CDLL(ext.__file__).gpucheck_pybind_scale_raw
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    fn.restype = ctypes.c_int
    y = torch.empty_like(x, requires_grad=False)
    _ready(x, w)
    with torch.cuda.device(x.device):
        err = fn(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.numel(), stream)
    _ready(y)
    if err:
        raise RuntimeError(f"gpucheck_pybind_scale_raw: CUDA error {err}")
    return y
