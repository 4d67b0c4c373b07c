"""The zoo's fused-ssim-shaped SSIM loss (zoo_ssim.cpp / .cu) through its autograd Function,
against a pure-PyTorch SSIM. Builds ``gpucheck_zoo_ssim_<build>``: ``clean`` (the twin; in
evaluation the partial-derivative maps are zero-element CPU placeholders; images of any
layout copied contiguous), ``noguard``, ``outdev_legacy`` (the map on the current device; the
forward kernel on stream 0), ``assume_contiguous`` (the backward reads the saved images as if
contiguous), ``nosync`` (the backward's shared-memory tile read before its barrier: judged
under compute-sanitizer racecheck). What each case must draw: ``gpucheck.selftest.ZOO``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
SHAPE = (2, 3, 37, 53)  # not block multiples


def _images(device):
    img1 = torch.rand(SHAPE, device=device)
    img2 = (img1 + 0.2 * torch.randn(SHAPE, device=device)).clamp(0, 1)
    return img1, img2


def _check_train(zoo_fn, ext, device, *, hwc=False):
    """One step of the loss and its gradient against the reference; ``hwc``: the render is
    laid out [B, H, W, C] (as image libraries and many renderers give it) and handed to the
    loss permuted to [B, C, H, W], a view with other strides."""
    img1, img2 = _images(device)
    leaf = (img1.permute(0, 2, 3, 1).contiguous() if hwc else img1).requires_grad_(True)
    image = leaf.permute(0, 3, 1, 2) if hwc else leaf
    loss = 1 - zoo_fn.fused_ssim(ext, image, img2, train=True)
    loss.backward()
    ref1 = img1.detach().double().cpu().requires_grad_(True)
    ref_loss = 1 - zoo_fn.ssim_reference(ref1, img2)
    ref_loss.backward()
    torch.testing.assert_close(loss.detach().double().cpu(), ref_loss.detach(), rtol=0, atol=1e-5)
    grad = leaf.grad.permute(0, 3, 1, 2) if hwc else leaf.grad
    scale = float(ref1.grad.abs().max())
    torch.testing.assert_close(grad.double().cpu(), ref1.grad, rtol=1e-3, atol=1e-3 * scale)


def _check_eval(zoo_fn, ext, device):
    img1, img2 = _images(device)
    with torch.no_grad():
        value = zoo_fn.fused_ssim(ext, img1, img2, train=False)
    torch.testing.assert_close(
        value.double().cpu(), zoo_fn.ssim_reference(img1, img2), rtol=0, atol=1e-5
    )


def test_ssim_clean_train(zoo_ext, zoo_fn, gpu_device):
    _check_train(zoo_fn, zoo_ext("ssim_clean"), gpu_device)


def test_ssim_clean_eval(zoo_ext, zoo_fn, gpu_device):
    _check_eval(zoo_fn, zoo_ext("ssim_clean"), gpu_device)


def test_ssim_noguard_train(zoo_ext, zoo_fn, gpu_device):
    # two GPUs: faults with the other device current, passes with its own current
    _check_train(zoo_fn, zoo_ext("ssim_noguard"), gpu_device)


def test_ssim_outdev_legacy_eval(zoo_ext, zoo_fn, gpu_device):
    """Evaluation: the map (on the current device with two GPUs) is reduced where it lies;
    the placeholders are the convention, no finding."""
    _check_eval(zoo_fn, zoo_ext("ssim_outdev_legacy"), gpu_device)


def test_ssim_clean_permuted_grad(zoo_ext, zoo_fn, gpu_device):
    """The gradient of an HWC render through a permuted view: the twin copies it contiguous
    in both passes."""
    _check_train(zoo_fn, zoo_ext("ssim_clean"), gpu_device, hwc=True)


def test_ssim_assume_contiguous_permuted_grad(zoo_ext, zoo_fn, gpu_device):
    """The same test; this build's backward reads the saved permuted image as if contiguous:
    the loss is right, its gradient is not."""
    _check_train(zoo_fn, zoo_ext("ssim_assume_contiguous"), gpu_device, hwc=True)


@pytest.mark.sanitizer(tools=("racecheck",))
def test_ssim_clean_sanitized_train(sanitizer_zoo_ext, zoo_fn, gpu_device):
    """The twin under racecheck: its tile is read after the barrier."""
    _check_train(zoo_fn, sanitizer_zoo_ext("ssim_clean"), gpu_device)


@pytest.mark.sanitizer(tools=("racecheck",))
def test_ssim_nosync_train(sanitizer_zoo_ext, zoo_fn, gpu_device):
    """A training step whose backward races on its shared-memory tile: the gradient may be
    right by luck; racecheck sees the hazard in every run."""
    _check_train(zoo_fn, sanitizer_zoo_ext("ssim_nosync"), gpu_device)
