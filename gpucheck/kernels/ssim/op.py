"""Fused SSIM on CUDA (``torch.ops.gpucheck.ssim_forward`` / ``ssim_backward``), differentiable.

The kernels (csrc/ssim) compute the same function as :func:`gpucheck.reference.ssim`:
an 11×11 Gaussian window (sigma 1.5), C1 = 0.01², C2 = 0.03², zero padding. With
``reduction="mean"`` (a training loss) the forward runs the backward kernel at once
(``ssim_train``: it also sums the map for the mean, bit for bit as the forward kernel does, so
no forward kernel runs; the gradient is the buffer the backward returns, so no extra memory)
and the backward only scales it (``ssim_scale_``); otherwise the backward recomputes the window
moments from the inputs (nothing saved but references to them). Autograd is registered in C++
(csrc/ssim/ssim.cpp).

Accuracy: float32 arithmetic (float64 for float64 images; 16-bit images are computed in
float32 and rounded once). Like every SSIM that forms the variances as E[x²] - mu², it loses
digits where the images are smooth (sigma ~ 0).
:func:`gpucheck.kernels.ssim.reference.rounding_sensitivity` estimates the error per pixel; the
kernels' measured error is <= 2.9 u times that estimate, which puts it at up to ~8e-4 on the
map of bright, flat images in [0, 1] (local standard deviation ~0.013 around 0.95) against
~5e-6 on uniform noise. The suite's bounds are a multiple of the estimate.

This module imports without the compiled extension; it is loaded on first call.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from gpucheck._csrc.extension import registered_op
from gpucheck.kernels.ssim.reference import check_args

#: the names gpucheck.ops exports of this kernel (gpucheck/kernels/__init__.py)
__all__ = ["ssim"]

PADDINGS = ("same", "valid")
REDUCTIONS = ("mean", "none")
WINDOW_SIZE = 11


def _map_shape(img: torch.Tensor, padding: str) -> tuple[Any, ...]:
    b, c, h, w = img.shape
    if padding == "valid":
        torch._check(
            h >= WINDOW_SIZE and w >= WINDOW_SIZE,
            lambda: f"padding='valid' needs H, W >= 11, got {list(img.shape)}",
        )
        return (b, c, h - 2 * (WINDOW_SIZE // 2), w - 2 * (WINDOW_SIZE // 2))
    return (b, c, h, w)


def _forward_fake(
    img1: torch.Tensor, img2: torch.Tensor, padding: str, reduction: str
) -> torch.Tensor:
    torch._check(img1.dim() == 4, lambda: f"img1 must be [B, C, H, W], got {list(img1.shape)}")
    if reduction == "mean":
        return img1.new_empty(())
    return img1.new_empty(_map_shape(img1, padding))


def _backward_fake(
    grad: torch.Tensor,
    img1: torch.Tensor,
    img2: torch.Tensor,
    padding: str,
    reduction: str,
    need_grad2: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    # The kernel returns contiguous gradients whatever the images' strides.
    grad2 = img2.new_empty(img2.shape) if need_grad2 else img2.new_empty((0,))
    return img1.new_empty(img1.shape), grad2


def _train_fake(
    img1: torch.Tensor, img2: torch.Tensor, padding: str, grad_scale: float, need_grad2: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch._check(img1.dim() == 4, lambda: f"img1 must be [B, C, H, W], got {list(img1.shape)}")
    grad2 = img2.new_empty(img2.shape) if need_grad2 else img2.new_empty((0,))
    return img1.new_empty(()), img1.new_empty(img1.shape), grad2


def _scale_fake(grad: torch.Tensor, upstream: torch.Tensor, factor: float) -> None:
    return None


@functools.cache
def load_ops() -> Any:
    """Load the extension and register the fake (meta) rules of the SSIM ops (``ssim_forward``,
    ``ssim_backward``; ``ssim_train`` and ``ssim_scale_``, the training step's forward with
    reduction mean and its in-place gradient scale, both used by the autograd rule).

    The autograd rule is C++ (csrc/ssim/ssim.cpp, registered for the Autograd key): a
    training step runs no Python beyond :func:`ssim` itself.

    Returns:
        The forward op's overload (``torch.ops.gpucheck.ssim_forward.default``), which
        :func:`ssim` calls directly (no overload resolution per call).

    Raises:
        gpucheck.errors.ExtensionNotBuilt: the compiled extension is not installed.
    """
    registered_op("gpucheck::ssim_backward", _backward_fake)
    registered_op("gpucheck::ssim_train", _train_fake)
    registered_op("gpucheck::ssim_scale_", _scale_fake)
    return registered_op("gpucheck::ssim_forward", _forward_fake)


def ssim(
    img1: torch.Tensor,
    img2: torch.Tensor,
    padding: str = "same",
    train: bool = True,
    reduction: str = "mean",
) -> torch.Tensor:
    """SSIM of two CUDA image batches with the fused kernels.

    Args:
        img1: ``[B, C, H, W]`` CUDA tensor, float32, float16, bfloat16 or float64 (values
            nominally in [0, 1]); any H, W >= 1 (>= 11 with ``padding="valid"``).
        img2: ``[B, C, H, W]``, same dtype and device as ``img1``.
        padding: ``"same"`` (zero padding, map ``[B, C, H, W]``) or ``"valid"`` (map
            ``[B, C, H-10, W-10]``).
        train: when False the call records no autograd graph (inference).
        reduction: ``"mean"`` (0-dim tensor) or ``"none"`` (the map).

    Returns:
        The mean SSIM (0-dim) or the SSIM map, in the images' dtype (accumulated in float32,
        float64 for float64 images). Differentiable with respect to both images when
        ``train`` is True; results are bitwise reproducible.

    Raises:
        ValueError: unknown ``padding``/``reduction``; wrong rank, mismatched shapes, empty
            images, images on different devices or not on a CUDA device.
        TypeError: an image is not a floating-point tensor, or the dtypes differ.
        RuntimeError: the kernel's own checks (``torch.ops.gpucheck.*`` called directly, or a
            dtype the kernel does not take), with the values received.
        gpucheck.errors.ExtensionNotBuilt: the compiled extension is not installed.
    """
    check_args(img1, img2, padding, reduction)  # the same messages as the reference
    if not (img1.is_cuda and img2.is_cuda):
        name, t = ("img1", img1) if not img1.is_cuda else ("img2", img2)
        raise ValueError(
            f"ssim: {name} must be a CUDA tensor, got one on {t.device} (use "
            "gpucheck.reference.ssim on the CPU)"
        )
    forward = load_ops()
    # Inference: autograd records nothing anyway unless an input requires grad, so the
    # no_grad context (about a microsecond per call) is entered only then.
    if train or not (img1.requires_grad or img2.requires_grad):
        return forward(img1, img2, padding, reduction)
    with torch.no_grad():
        return forward(img1, img2, padding, reduction)
