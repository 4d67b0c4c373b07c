"""Memory defects of the self-test, each beside its clean twin: a raw ``cudaMalloc`` per call
without free (leak, seen only by NVML), tensors kept across calls (leak, PyTorch's allocator),
a scratch buffer of N x N floats (growth over the sizes), and a checkpoint writer that stores
activated values read back by a 3DGS loader (double activation).

The leak cases are marked ``gpucheck_repeat``: the harness runs their body several times and
compares the memory after the first run with the memory after the last.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_selftest import _x, ext  # noqa: E402,F401  (the pybind extension fixture)

LEAK_BYTES = 16 << 20
_KEPT: list = []


@pytest.mark.gpu
@pytest.mark.gpucheck_repeat(5)
def test_leak_raw_cudamalloc(ext, gpu_device):  # noqa: F811
    x = _x(gpu_device)
    torch.testing.assert_close(ext.add_one_leaking(x, LEAK_BYTES), x + 1, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.gpucheck_repeat(5)
def test_leak_kept_tensors(gpu_device):
    x = _x(gpu_device)
    _KEPT.append(torch.empty(4 << 20, device=gpu_device))  # 16 MiB more on every call
    torch.testing.assert_close(x + 1 - 1, x)


@pytest.mark.gpu
@pytest.mark.gpucheck_repeat(5)
def test_clean_repeat(ext, gpu_device):  # noqa: F811
    x = _x(gpu_device)
    torch.testing.assert_close(ext.add_one_guarded(x), x + 1, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1024, 2048, 4096])
def test_growth_quadratic(ext, gpu_device, n):  # noqa: F811
    x = torch.rand(n, device=gpu_device)
    torch.testing.assert_close(ext.add_one_quadratic_scratch(x), x + 1, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1 << 20, 1 << 21, 1 << 22])
def test_growth_linear_clean(gpu_device, n):
    x = torch.rand(n, device=gpu_device)
    scratch = torch.zeros(4 * n, device=gpu_device)
    torch.testing.assert_close(x + scratch[:n] + 1, x + 1)


def _checkpoints():
    pytest.importorskip("plyfile")  # gpucheck.checkpoints reads PLY with it
    import gpucheck.checkpoints as ck

    return ck


def test_double_activation_loader():
    ck = _checkpoints()
    from gpucheck.checkpoints import activations as act

    def save_activated(p, path):
        """Defect (story 3): writes the values the renderer takes, in the raw fields' place."""
        ck.write_ply(ck.GaussianParams(
            p.means, p.features_dc, p.features_rest, act.scale_activation(p.log_scales),
            act.opacity_activation(p.opacity_logits), act.rotation_activation(p.rotations_raw),
            p.sh_degree), path)

    ck.check_roundtrip(save_activated, ck.read_ply)


def test_clean_roundtrip():
    ck = _checkpoints()
    ck.check_roundtrip(ck.write_ply, ck.read_ply)
