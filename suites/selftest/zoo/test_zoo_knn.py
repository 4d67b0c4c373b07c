"""The zoo's simple-knn-shaped ``distCUDA2`` (zoo_knn.cpp / .cu) through its autograd
Function, against exhaustive distances in PyTorch. Builds ``gpucheck_zoo_knn_<build>``:
``clean`` (the twin: thrust on the current stream, cudaMalloc freed), ``noguard``,
``setdevice_thrust0`` (simple-knn's published fix, a bare cudaSetDevice; thrust on the
default stream). What each case must draw: ``gpucheck.selftest.ZOO``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
N = 2_001


def _check(zoo_fn, ext, device):
    points = torch.randn(N, 3, device=device) * 0.5
    got = zoo_fn.dist_cuda2(ext, points)
    assert got.device == points.device
    torch.testing.assert_close(
        got.double().cpu(), zoo_fn.dist_reference(points), rtol=1e-4, atol=1e-9
    )


def test_knn_clean(zoo_ext, zoo_fn, gpu_device):
    _check(zoo_fn, zoo_ext("knn_clean"), gpu_device)


@pytest.mark.gpucheck_repeat(5)
def test_knn_clean_repeat(zoo_ext, zoo_fn, gpu_device):
    _check(zoo_fn, zoo_ext("knn_clean"), gpu_device)


def test_knn_noguard(zoo_ext, zoo_fn, gpu_device):
    # two GPUs: faults with the other device current, passes with its own current
    _check(zoo_fn, zoo_ext("knn_noguard"), gpu_device)


def test_knn_noguard_thrust0(zoo_ext, zoo_fn, gpu_device):
    # story 2 as published: raw kernels and thrust, neither on the input's device nor on the
    # caller's stream. Two GPUs: thrust throws on the other device and the process aborts
    _check(zoo_fn, zoo_ext("knn_noguard_thrust0"), gpu_device)


def test_knn_setdevice_thrust0(zoo_ext, zoo_fn, gpu_device):
    _check(zoo_fn, zoo_ext("knn_setdevice_thrust0"), gpu_device)
