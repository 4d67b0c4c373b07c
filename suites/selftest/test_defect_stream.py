"""Self-test of the wrong-stream detector: SSIM built from csrc/ssim with
``-DGPUCHECK_DEFECT_LEGACY_STREAM`` (every launch on stream 0, the legacy default stream).

The defect build registers its ops under ``torch.ops.gpucheck_defect_legacy_stream`` (the
``GPUCHECK_LIBRARY`` macro of csrc/library.h), so it loads next to the real extension in one
worker. Run with ``gpucheck run --suite selftest`` (never a default suite). Expected: both
cases pass (the inputs are synchronized first, so the defect's result is right, as it always
is under ``CUDA_LAUNCH_BLOCKING=1``); the record of ``test_legacy_stream_ssim`` carries
wrong-stream errors naming ``gpucheck_defect_legacy_stream::ssim_forward`` /
``ssim_backward`` and their kernels, the record of ``test_clean_ssim`` none.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

MACRO = "GPUCHECK_DEFECT_LEGACY_STREAM"


@pytest.fixture(scope="module")
def defect_ops():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible")
    from gpucheck._csrc.defects import build_defect

    return getattr(torch.ops, build_defect(MACRO))


def _images(device):
    x = torch.rand(2, 3, 113, 203, device=device)
    return x, (0.7 * x + 0.3 * torch.rand_like(x)).clamp(0, 1)


def _check(ops, device):
    from gpucheck.kernels.ssim.reference import ssim as ref_ssim

    x, y = _images(device)
    torch.cuda.synchronize(device)  # the defect is not ordered after these: make them ready
    got = ops.ssim_forward(x, y, "same", "mean")
    grad1, _ = ops.ssim_backward(torch.ones((), device=device), x, y, "same", "mean", False)
    torch.cuda.synchronize(device)
    want = ref_ssim(x.double(), y.double())
    torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=5e-5)
    assert grad1.shape == x.shape and torch.isfinite(grad1).all()


@pytest.mark.gpu
def test_legacy_stream_ssim(defect_ops, gpu_device):
    _check(defect_ops, gpu_device)


@pytest.mark.gpu
def test_clean_ssim(gpu_device):
    from gpucheck._csrc import extension

    if not extension.available():
        pytest.skip("gpucheck's extension is not built")
    _check(torch.ops.gpucheck, gpu_device)
