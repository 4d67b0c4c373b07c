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


def _save_activated(p, path):
    """Defect (story 3): writes the values the renderer takes, in the raw fields' place."""
    from gpucheck.checkpoints import activations as act

    ck = _checkpoints()
    ck.write_ply(
        ck.GaussianParams(
            p.means,
            p.features_dc,
            p.features_rest,
            act.scale_activation(p.log_scales),
            act.opacity_activation(p.opacity_logits),
            act.rotation_activation(p.rotations_raw),
            p.sh_degree,
        ),
        path,
    )


def test_double_activation_loader():
    ck = _checkpoints()
    ck.check_roundtrip(_save_activated, ck.read_ply)


def test_clean_roundtrip():
    ck = _checkpoints()
    ck.check_roundtrip(ck.write_ply, ck.read_ply)


# --- the same defect, seen where the user meets it: the first render after the resume ------

#: story 3's GPU: 23.68 GiB; the render is given it as its binning budget (``max_bytes``)
USER_GPU_BYTES = int(23.68 * (1 << 30))
WIDTH, HEIGHT, FOCAL = 1920, 1080, 1100.0
N_TRAINED = 1_000_000


def _trained(n):
    """Raw parameters shaped like a trained scene in front of an identity camera: log-scales
    around -5 (world sizes ~7e-3 at depths 2-8), opacity logits N(0, 2), raw quaternions."""
    ck = _checkpoints()
    gen = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    z = 2 + 6 * torch.rand(n, 1, generator=gen)
    half = torch.tensor([WIDTH, HEIGHT]) / (2 * FOCAL)
    xy = (torch.rand(n, 2, generator=gen) * 2 - 1) * half * z
    return ck.GaussianParams(
        means=torch.cat([xy, z], 1),
        features_dc=0.5 * torch.randn(n, 1, 3, generator=gen),
        features_rest=torch.zeros(n, 0, 3),
        log_scales=-5 + 0.5 * torch.randn(n, 3, generator=gen),
        opacity_logits=2 * torch.randn(n, generator=gen),
        rotations_raw=torch.randn(n, 4, generator=gen),
        sh_degree=0,
    )


def _resume_and_render(save, tmp_path, device):
    """Save a trained scene with ``save``, load it as 3DGS does (the file's fields are raw
    parameters, activated at render time) and render it within the user's GPU."""
    ck = _checkpoints()
    from gpucheck.ops import rasterize

    path = tmp_path / "point_cloud.ply"
    save(_trained(N_TRAINED), path)
    g = ck.read_ply(path).activated()
    return rasterize(
        g.means.to(device),
        g.scales.to(device),
        g.rotations.to(device),
        g.opacities.to(device),
        sh=g.sh.to(device),
        sh_degree=g.sh_degree,
        viewmat=torch.eye(4, device=device),
        K=torch.tensor([[FOCAL, 0, WIDTH / 2], [0, FOCAL, HEIGHT / 2], [0, 0, 1]], device=device),
        width=WIDTH,
        height=HEIGHT,
        max_bytes=USER_GPU_BYTES,
    )


@pytest.mark.gpu
def test_double_activation_render(gpu_device, tmp_path):
    # raises gpucheck.MemoryAnomalyError (the preflight): the finding is oom-anomaly
    _resume_and_render(_save_activated, tmp_path, gpu_device)


@pytest.mark.gpu
def test_clean_render(gpu_device, tmp_path):
    ck = _checkpoints()
    from gpucheck.kernels.splat.reference import BYTES_PER_INTERSECTION

    got = _resume_and_render(ck.write_ply, tmp_path, gpu_device)
    assert 0 < got.n_intersections * BYTES_PER_INTERSECTION < USER_GPU_BYTES
    assert bool(torch.isfinite(got.image).all()) and float(got.alpha.max()) > 0.5
