"""Self-test of the per-call checks on a pybind11 extension (not ``torch.ops``): the
extension of pybind_defects.cpp / .cu, called from the ``torch.autograd.Function`` of
pybind_defects.py, built clean and once per ``GPUCHECK_PYBIND_DEFECT_*`` macro
(``gpucheck._csrc.pybind.build_pybind``; modules ``gpucheck_pybind_<build>``).

Expected (gpucheck.selftest.DEFECTS): ``test_legacy_stream_pybind`` — wrong-stream naming
``gpucheck_pybind_legacy_stream.scale_forward`` (its kernel on stream 0);
``test_cub_stream0_pybind`` — wrong-stream naming ``...scale_backward`` (cub on stream 0,
called by autograd's backward); ``test_output_current_device_pybind`` — wrong-device naming
``...scale_forward`` (2 GPUs); ``test_set_device_pybind`` — device-state-leak naming
``...scale_forward`` (2 GPUs); ``test_unwatched_caller_pybind`` — a case-level wrong-stream
naming ``scale_kernel`` and its library (launched through ``ctypes`` on stream 0 while a
watched call's profiler window was open); ``test_cpu_argument_pybind`` — mixed-devices
naming ``gpucheck_pybind_clean.shade`` and its CPU argument ``bg`` (the kernel then reads a
host pointer: a CUDA error, or a silent read where the GPU may read pageable memory; it runs
last). The ``test_clean_*`` twins must draw no finding.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
N = 10_007  # not a multiple of the block size
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pybind_ext():
    """``pybind_ext(build)``: the module of a build (``clean`` or a defect's name), JIT-built
    on first use into gpucheck's build cache."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible")
    from gpucheck._csrc.pybind import build_pybind

    loaded = {}

    def get(build):
        if build not in loaded:
            loaded[build] = build_pybind(build)
        return loaded[build]

    return get


@pytest.fixture(scope="module")
def fn():
    """pybind_defects.py, imported by its path (whatever pytest's import mode)."""
    spec = importlib.util.spec_from_file_location(
        "gpucheck_selftest_pybind_defects", HERE / "pybind_defects.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _inputs(device, grad=False):
    x = torch.rand(N, device=device) * 4 - 2
    w = torch.rand(1, device=device) + 0.5
    return x.requires_grad_(grad), w.requires_grad_(grad)


def _check(y, x, w):
    torch.testing.assert_close(y.detach().cpu(), (x * w).detach().cpu(), rtol=1e-6, atol=0)


def _forward_backward(fn, ext, device):
    x, w = _inputs(device, grad=True)
    y = fn.scale(ext, x, w)
    y.sum().backward()
    _check(y, x, w)
    torch.testing.assert_close(x.grad.cpu(), w.detach().cpu().expand(N), rtol=0, atol=0)
    torch.testing.assert_close(
        w.grad.cpu(), x.detach().sum().reshape(1).cpu(), rtol=1e-4, atol=1e-3
    )


def _needs_other(why):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs another device current ({why}); one GPU is visible")


def test_legacy_stream_pybind(pybind_ext, fn, gpu_device):
    _forward_backward(fn, pybind_ext("legacy_stream"), gpu_device)


def test_cub_stream0_pybind(pybind_ext, fn, gpu_device):
    _forward_backward(fn, pybind_ext("cub_stream0"), gpu_device)


def test_output_current_device_pybind(pybind_ext, fn, gpu_device, other_device):
    _needs_other("where a result allocated on the current device lands")
    x, w = _inputs(gpu_device)
    _check(fn.scale(pybind_ext("output_current_device"), x, w), x, w)


def test_set_device_pybind(pybind_ext, fn, gpu_device, other_device):
    _needs_other("the caller's device a bare cudaSetDevice overwrites")
    x, w = _inputs(gpu_device)
    _check(fn.scale(pybind_ext("set_device"), x, w), x, w)


def test_unwatched_caller_pybind(pybind_ext, fn, gpu_device):
    ext = pybind_ext("clean")
    x, w = _inputs(gpu_device, grad=True)
    y = fn.scale(ext, x, w)  # watched: the profiler window stays open for its backward
    raw = fn.raw_scale(ext, x.detach(), w.detach(), None)  # ctypes, stream 0
    y.sum().backward()
    _check(raw, x, w)


def test_clean_pybind(pybind_ext, fn, gpu_device):
    ext = pybind_ext("clean")
    _forward_backward(fn, ext, gpu_device)
    x = torch.rand(N, 3, device=gpu_device)
    bg = torch.tensor([0.25, 0.5, 0.75], device=gpu_device)
    gain = torch.tensor(2.0)  # a 0-dim CPU tensor: a host scalar, fine
    out = fn.shade(ext, x, bg, gain)
    torch.testing.assert_close(out.cpu(), ((x + bg) * 2).cpu(), rtol=1e-6, atol=0)


def test_clean_unwatched_caller_pybind(pybind_ext, fn, gpu_device):
    ext = pybind_ext("clean")
    x, w = _inputs(gpu_device, grad=True)
    y = fn.scale(ext, x, w)
    stream = torch.cuda.current_stream(gpu_device).cuda_stream
    raw = fn.raw_scale(ext, x.detach(), w.detach(), stream)  # ctypes, the current stream
    y.sum().backward()
    _check(raw, x, w)


def test_cpu_argument_pybind(pybind_ext, fn, gpu_device):
    """Last: the kernel may lose the process's CUDA context."""
    ext = pybind_ext("clean")
    x = torch.rand(N, 3, device=gpu_device)
    bg = torch.tensor([0.25, 0.5, 0.75])  # the config slip: the background on the CPU
    out = fn.shade(ext, x, bg, torch.tensor(1.0))
    torch.testing.assert_close(out.cpu(), (x.cpu() + bg), rtol=1e-6, atol=0)
