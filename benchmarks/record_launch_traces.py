"""Record the launch-trace windows the wrong-stream and kernel-device detectors read, on a
GPU, as CPU-test fixtures (tests/fixtures/launches/).

Usage (on a machine with a CUDA GPU, after ``pip install --no-build-isolation -e .`` with
GPUCHECK_KERNELS including ssim; knn is used when built)::

    python benchmarks/record_launch_traces.py OUT_DIR

Writes OUT_DIR/<scenario>.json: {"scenario", "doc", "recorded_on", "current_stream",
"windows"}, the windows being exactly what the detectors get from
:func:`gpucheck.detectors.launch_trace.LaunchTrace.finish`, with the poisoned stream of the
harness current on cuda:0. Also OUT_DIR/cost.json: what the trace costs on 5000 small torch
ops and on 200 calls of an extension op.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from gpucheck import _csrc
from gpucheck.detectors.launch_trace import LaunchTrace
from gpucheck.ops import _ext
from gpucheck.runner.poison import stream_made_current


def record(scenarios: dict[str, Callable[[], None]], dev: torch.device, stream: Any,
           out: Path) -> None:
    """Run each scenario once to warm up (lazy inits outside the recorded window), then again
    inside a launch trace; write OUT/<scenario>.json with the windows the detectors get."""
    for fn in scenarios.values():
        fn()
    torch.cuda.synchronize()
    for name, fn in scenarios.items():
        trace = LaunchTrace()
        trace.acquire()
        fn()
        windows = [asdict(w) for w in trace.finish()]
        (out / f"{name}.json").write_text(json.dumps({
            "scenario": name, "doc": fn.__doc__,
            "recorded_on": f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}",
            "current_stream": repr(stream), "windows": windows}, indent=0) + "\n")


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.ones(1, device=dev)
    defect = getattr(torch.ops, _csrc.build_defect("GPUCHECK_DEFECT_LEGACY_STREAM"))
    _ext.load()
    from gpucheck.ops.ssim_op import ssim

    x = torch.rand(2, 3, 113, 203, device=dev)
    y = torch.rand_like(x)
    one = torch.ones((), device=dev)

    def clean_ssim() -> None:
        a = x.clone().requires_grad_(True)
        (1 - ssim(a, y)).backward()

    def legacy_stream_ssim() -> None:
        torch.cuda.synchronize(dev)
        defect.ssim_forward(x, y, "same", "mean")
        defect.ssim_backward(one, x, y, "same", "mean", True)

    def torch_streams() -> None:
        """Torch's own ops on the current stream, on stream 0 and on a private stream; an
        extension op on that private stream (the test's own `with torch.cuda.stream`)."""
        z = x * 2
        with torch.cuda.stream(torch.cuda.default_stream(dev)):
            z.add(1)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            z.sub(1)
            ssim(x, y)
        torch.cuda.current_stream(dev).wait_stream(side)

    scenarios = {"clean_ssim": clean_ssim, "legacy_stream_ssim": legacy_stream_ssim,
                 "torch_streams": torch_streams}
    if hasattr(torch.ops.gpucheck, "knn_mean_sq_dist"):
        points = torch.rand(20_000, 3, device=dev)

        def knn_side_stream() -> None:
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                torch.ops.gpucheck.knn_mean_sq_dist(points, 3)
            side.synchronize()

        scenarios["knn_side_stream"] = knn_side_stream
    with stream_made_current(dev) as stream:
        record(scenarios, dev, stream, out)
        # cost: 5000 small torch ops, and 200 calls of an extension op, without and with it
        import time

        small = x[:1, :1, :8, :8].clone()

        def many() -> None:
            t = small.clone()
            for _ in range(5000):
                t.add_(1)
            for _ in range(200):
                ssim(x, y)

        cost = {}
        for label, traced in (("warm", False), ("plain", False), ("traced", True)):
            trace = LaunchTrace()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if traced:
                trace.acquire()
            many()
            if traced:
                trace.finish()
            torch.cuda.synchronize()
            cost[label + "_s"] = time.perf_counter() - t0
        (out / "cost.json").write_text(json.dumps(cost, indent=1))
        print(cost)
    print("recorded", sorted(scenarios))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
