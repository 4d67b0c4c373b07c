"""Record the launch-trace windows of the self-test's pybind11 extension on a GPU, as CPU-test
fixtures (tests/fixtures/launches/pybind_*.json): what the wrong-stream detector reads for a
compiled extension module's functions called from an ``autograd.Function``, and for a kernel
that no watched call launched.

Usage (on a machine with a CUDA GPU and nvcc, after ``pip install --no-build-isolation -e .``)::

    python benchmarks/record_pybind_traces.py OUT_DIR

Builds (or loads from gpucheck's cache) the clean, ``legacy_stream`` and ``cub_stream0``
builds (``gpucheck._csrc.build_pybind``) and writes OUT_DIR/<scenario>.json: {"scenario",
"doc", "recorded_on", "current_stream", "windows"}, the windows being exactly what
:func:`gpucheck.detectors.launch_trace.LaunchTrace.finish` returns (with the libraries the
unclaimed kernels were found in), with the harness's poisoned stream current on cuda:0. Run it
from the repository's root: the frames in the logs are relative to the working directory.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch
from record_launch_traces import record  # beside this file

from gpucheck import _csrc, _resources
from gpucheck.detectors import ext_watch
from gpucheck.runner.poison import stream_made_current


def _functions() -> Any:
    path = _resources.suites() / "selftest" / "pybind_defects.py"
    spec = importlib.util.spec_from_file_location("gpucheck_selftest_pybind_defects", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.ones(1, device=dev)
    ext_watch.install()  # before the builds are imported: their functions get wrapped
    builds = {b: _csrc.build_pybind(b) for b in ("clean", "legacy_stream", "cub_stream0")}
    fn = _functions()
    n = 10_007

    def inputs() -> tuple[torch.Tensor, torch.Tensor]:
        x = (torch.rand(n, device=dev) * 4 - 2).requires_grad_(True)
        return x, (torch.rand(1, device=dev) + 0.5).requires_grad_(True)

    def forward_backward(build: str) -> None:
        x, w = inputs()
        fn.scale(builds[build], x, w).sum().backward()

    def pybind_clean() -> None:
        """The clean build: Scale forward + backward (autograd), then the C entry point
        through ctypes on the current stream."""
        x, w = inputs()
        y = fn.scale(builds["clean"], x, w)
        fn.raw_scale(builds["clean"], x.detach(), w.detach(),
                     torch.cuda.current_stream(dev).cuda_stream)
        y.sum().backward()

    def pybind_legacy_stream() -> None:
        """GPUCHECK_PYBIND_DEFECT_LEGACY_STREAM: the forward kernel on stream 0."""
        forward_backward("legacy_stream")

    def pybind_cub_stream0() -> None:
        """GPUCHECK_PYBIND_DEFECT_CUB_STREAM0: backward's cub reduction on stream 0."""
        forward_backward("cub_stream0")

    def pybind_unwatched_caller() -> None:
        """The clean build's C entry point through ctypes on stream 0 while Scale's window is
        open (its backward pending)."""
        x, w = inputs()
        y = fn.scale(builds["clean"], x, w)
        fn.raw_scale(builds["clean"], x.detach(), w.detach(), None)
        y.sum().backward()

    scenarios = {f.__name__: f for f in (pybind_clean, pybind_legacy_stream, pybind_cub_stream0,
                                         pybind_unwatched_caller)}
    with stream_made_current(dev) as stream:
        record(scenarios, dev, stream, out)
    print("recorded", sorted(scenarios))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
