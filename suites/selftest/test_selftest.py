"""The harness's self-test: a deliberately broken extension among good cases.

Run with ``gpucheck run --all-devices --suite selftest [--mode sanitizer:memcheck]``; it is
never part of the default suites. Expected on >= 2 GPUs (``tools/gpu harness`` checks it):
the good cases pass on every device; ``test_unguarded_launch`` fails with a CUDA error (the
kernel runs on the current device, not the tensor's); ``test_abort`` is ``crashed``
(SIGABRT) and the harness continues in a fresh worker; ``test_overrun`` passes in blocking
mode (the write lands in slack memory) and fails under memcheck. Its sanitizer cases run in
the memcheck passes only (``sanitizer(tools=("memcheck",))``); the defects of the other tools
are in test_defect_*.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ext():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible")
    from torch.utils import cpp_extension

    from gpucheck._csrc.toolchain import build_dir, torch_build_env

    torch_build_env()  # same compiler and toolkit rule as the real extension
    name = "gpucheck_selftest_defects"  # built into gpucheck's cache, never beside this file
    return cpp_extension.load(
        name=name,
        sources=[str(HERE / "defects.cpp"), str(HERE / "defects.cu")],
        extra_cuda_cflags=["-lineinfo"],
        build_directory=str(build_dir(name)),
        verbose=False,
    )


def _x(device):
    return torch.rand(10_000, device=device)


@pytest.mark.gpu
@pytest.mark.sanitizer(tools=("memcheck",))
@pytest.mark.parametrize("rep", range(3))
def test_good_guarded(ext, gpu_device, rep):
    x = _x(gpu_device)
    torch.testing.assert_close(ext.add_one_guarded(x), x + 1, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.sanitizer(tools=("memcheck",))
def test_unguarded_launch(ext, gpu_device, other_device):
    if torch.cuda.device_count() < 2:  # not `other_device is None`: the re-run must run
        pytest.skip("needs another device current to provoke a wrong-device launch")
    x = _x(gpu_device)
    y = ext.add_one_unguarded(x)
    torch.cuda.synchronize(gpu_device)
    torch.testing.assert_close(y, x + 1, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.sanitizer(tools=("memcheck",))
def test_overrun(ext, gpu_device):
    x = _x(gpu_device)
    torch.testing.assert_close(ext.add_one_overrun(x), x + 1, rtol=0, atol=0)


@pytest.mark.gpu
def test_abort(ext, gpu_device):
    ext.abort_process(_x(gpu_device))


@pytest.mark.gpu
@pytest.mark.sanitizer(tools=("memcheck",))
def test_good_after_the_defects(ext, gpu_device):
    x = _x(gpu_device)
    torch.testing.assert_close(ext.add_one_guarded(x * 2), x * 2 + 1, rtol=0, atol=0)
