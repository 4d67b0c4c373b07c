"""Self-test of the wrong-device diagnosis on gpucheck's own rasterizer, built from csrc/splat
with ``GPUCHECK_DEFECT_BUFFERS_CURRENT_DEVICE`` (``gpucheck._csrc.DEFECTS``; ops under
``torch.ops.gpucheck_defect_buffers_current_device``).

The defect is the one of the original 3DGS rasterizer: its binning buffers (sort keys, Gaussian
ids, the sort's scratch) are allocated for the caller's current device, not for the input's.
On one GPU, or with the input's device current, every render is right; with another device
current the kernels write into another GPU's memory. Expected (gpucheck.selftest.DEFECTS):
``test_buffers_current_device_splat`` fails with another device current and passes with its
target current (wrong-device, 2 GPUs). ``test_clean_splat`` does the same with the real
extension and must draw no finding.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

WIDTH, HEIGHT, N = 203, 113, 1000


def _scene(device):
    """Random Gaussians in front of an identity camera (fresh random data, never zeros)."""
    f = 0.5 * WIDTH / math.tan(math.radians(30))
    z = 2 + 4 * torch.rand(N, 1)
    xy = (torch.rand(N, 2) * 2 - 1) * torch.tensor([WIDTH, HEIGHT]) / (2 * f) * z
    args = dict(means=torch.cat([xy, z], 1), scales=torch.exp(-4 + 2 * torch.rand(N, 3)),
                rotations=torch.randn(N, 4), opacities=0.05 + 0.95 * torch.rand(N),
                colors=torch.rand(N, 3), viewmat=torch.eye(4),
                K=torch.tensor([[f, 0, WIDTH / 2], [0, f, HEIGHT / 2], [0, 0, 1]]),
                background=torch.rand(3))
    return {k: v.to(device).contiguous() for k, v in args.items()}


def _render(ops, s):
    """Project and composite with ``ops`` (the op pair ``gpucheck.ops.rasterize`` calls)."""
    means2d, conics, rgb, depths, _radii, _tiles, ranges, ids = ops.splat_project(
        s["means"], s["scales"], s["rotations"], s["opacities"], s["colors"], s["viewmat"],
        s["K"], s["background"], WIDTH, HEIGHT, -1)
    return ops.splat_render(means2d, conics, s["opacities"], rgb, depths, s["background"],
                            ranges, ids, WIDTH, HEIGHT)[0]


def _check(ops, device):
    """The image of ``ops`` equals the float64 reference rasterizer's on the same scene, up to
    float32 rounding and the few pixels where a Gaussian's alpha sits on the 1/255 cut-off (the
    bound of suites/splat)."""
    from gpucheck.reference import rasterize as reference

    s = _scene(device)
    got = _render(ops, s)
    torch.cuda.synchronize(device)
    assert got.device == device, f"image on {got.device}, inputs on {device}"
    want = reference(**{k: v.cpu().double() for k, v in s.items()}, width=WIDTH,
                     height=HEIGHT).image
    err = (got.cpu().double() - want).abs()
    assert int((err > 1e-4).sum()) <= 2, f"{int((err > 1e-4).sum())} values beyond 1e-4"
    assert float(err.max()) <= 0.02, f"max error {float(err.max()):.3g}"


def test_buffers_current_device_splat(defect_ops, gpu_device, other_device):
    if torch.cuda.device_count() < 2:  # not `other_device is None`: the re-run must run
        pytest.skip("needs another device current, where the binning buffers then land; one "
                    "GPU is visible")
    _check(defect_ops("buffers_current_device"), gpu_device)


def test_clean_splat(clean_ops, gpu_device):
    _check(clean_ops, gpu_device)
