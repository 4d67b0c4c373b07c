"""Self-test of the wrong-device diagnosis, memcheck and racecheck on gpucheck's own SSIM,
built from csrc/ssim with one ``GPUCHECK_DEFECT_*`` macro each (``gpucheck._csrc.defects.DEFECTS``;
ops under ``torch.ops.gpucheck_defect_<name>``).

Every case is a correct forward + backward step on small images: only the detector meant for
its defect can tell. Expected (gpucheck.selftest.DEFECTS): ``test_no_guard_ssim`` fails with
another device current and passes with its target current (wrong-device, 2 GPUs);
``test_shared_oob_ssim``: memcheck reports the out-of-range ``__shared__`` write in the forward
kernel; ``test_no_sync_ssim``: racecheck reports the race of the backward kernel's missing
``__syncthreads``. ``test_clean_ssim`` runs the real extension in both sanitizer passes and
must draw no finding.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

#: suites/ssim/test_ssim.py's float32 tolerances: forward (rtol, atol), gradient relative L2
MAP_TOL = (2e-4, 5e-5)
GRAD_REL_TOL = 1e-4

pytestmark = pytest.mark.gpu


def _step(ops, device, shape=(1, 3, 45, 67)):
    """Forward and backward of the SSIM loss, checked against the float64 reference."""
    from gpucheck.kernels.ssim.reference import ssim as ref_ssim

    x = torch.rand(shape, device=device)
    y = (0.7 * x + 0.3 * torch.rand_like(x)).clamp(0, 1)
    got = ops.ssim_forward(x, y, "same", "mean")
    grad1, _ = ops.ssim_backward(torch.ones((), device=device), x, y, "same", "mean", False)
    x64 = x.cpu().double().requires_grad_(True)
    want = ref_ssim(x64, y.cpu().double())
    want.backward()
    torch.testing.assert_close(got.cpu().double(), want.detach(), rtol=MAP_TOL[0], atol=MAP_TOL[1])
    err = (grad1.cpu().double() - x64.grad).norm() / x64.grad.norm()
    assert err <= GRAD_REL_TOL, f"gradient: relative L2 error {err:.3g}"


def test_no_guard_ssim(defect_ops, gpu_device, other_device):
    if torch.cuda.device_count() < 2:  # not `other_device is None`: the re-run must run
        pytest.skip(
            "needs another device current to provoke a launch on the wrong device; "
            "one GPU is visible"
        )
    _step(defect_ops("no_guard_ssim"), gpu_device, (2, 3, 113, 203))


@pytest.mark.sanitizer(tools=("memcheck",))
def test_shared_oob_ssim(sanitizer_defect_ops, gpu_device):
    _step(sanitizer_defect_ops("shared_oob"), gpu_device)


@pytest.mark.sanitizer(tools=("racecheck",))
def test_no_sync_ssim(sanitizer_defect_ops, gpu_device):
    _step(sanitizer_defect_ops("no_sync"), gpu_device)


@pytest.mark.sanitizer(tools=("memcheck", "racecheck"))
def test_clean_ssim(clean_ops, gpu_device):
    _step(clean_ops, gpu_device)
