"""The demo suite of the harness's tests and of the report's real CPU run: passing, failing,
skipped, erroring cases, and a CUDA error, an abort and a hang when DEMO_CUDA_ERROR,
DEMO_ABORT and DEMO_HANG are set."""

from __future__ import annotations

import subprocess
import textwrap
import time
from pathlib import Path

from clirun import start

SUITE = textwrap.dedent("""
    import os, time, pytest

    def test_ok():
        assert sum(range(5)) == 10

    def test_fail():
        assert [1, 2] == [1, 3]

    @pytest.mark.skip(reason="not on this machine")
    def test_skip():
        pass

    def test_gpu(gpu_device):
        assert gpu_device.type == "cuda"

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture exploded")

    def test_setup_error(broken):
        pass

    @pytest.fixture
    def stream():  # its teardown meets the lost context too (a CUDA call there fails)
        yield
        if os.environ.get("DEMO_CUDA_ERROR"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def test_cuda_error(stream):
        if os.environ.get("DEMO_CUDA_ERROR"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def test_abort():
        if os.environ.get("DEMO_ABORT"):
            # what libstdc++ writes to the fd when an exception escapes a noexcept function
            os.write(2, b"terminate called after throwing an instance of "
                        b"'thrust::system_error'\\n  what():  parallel_for failed\\n")
            os.abort()

    def test_hang():
        if os.environ.get("DEMO_HANG"):
            time.sleep(600)

    def test_last():
        assert True
""")


def start_until_stuck(project: Path, out: Path) -> tuple[subprocess.Popen, Path]:
    """`gpucheck run` in the background, returned once its worker is inside test_hang."""
    proc = start(
        "run",
        "--cpu-only",
        "--quiet",
        "--out",
        str(out),
        "--timeout",
        "300",
        cwd=project,
        env={"DEMO_HANG": "1"},
    )
    state = out / "workers" / "cpu.blocking.state.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if state.exists() and "test_hang" in state.read_text():
            break
        time.sleep(0.2)
    return proc, state
