"""Record the profiler events the wrong-stream detector reads, on a GPU, as CPU-test fixtures.

Usage (on a machine with a CUDA GPU, after ``pip install --no-build-isolation -e .`` with
GPUCHECK_KERNELS including ssim; knn is used when built)::

    python benchmarks/record_stream_traces.py OUT_DIR

Writes OUT_DIR/<scenario>.json: {"scenario", "recorded_on", "current_stream", "events"}, the
events being exactly what the detector gets from :func:`wrong_stream.plain_events`, with
the poisoned stream of the harness current on cuda:0. Also OUT_DIR/cost.json: the
profiler's cost on 5000 small torch ops.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from gpucheck import _csrc
from gpucheck.detectors.base import CaseInfo
from gpucheck.detectors.wrong_stream import WrongStreamDetector
from gpucheck.ops import _ext
from gpucheck.runner.poison import stream_made_current


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
    case = CaseInfo("cuda:0", "record", "record")
    with stream_made_current(dev) as stream:
        for fn in scenarios.values():  # warm-up: lazy inits outside the recorded window
            fn()
        torch.cuda.synchronize()
        for name, fn in scenarios.items():
            det = WrongStreamDetector()
            det.case_started(case)
            fn()
            events = det.stop(full=True)
            (out / f"{name}.json").write_text(json.dumps({
                "scenario": name, "doc": fn.__doc__,
                "recorded_on": f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}",
                "current_stream": repr(stream), "events": events}, indent=0))
        # cost: 5000 small torch ops, unprofiled vs profiled (body, and stop + parse)
        import time

        def many() -> None:
            t = x[:1, :1, :8, :8].clone()
            for _ in range(5000):
                t.add_(1)
        many()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        many()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        det = WrongStreamDetector()
        t2 = time.perf_counter()
        det.case_started(case)
        t3 = time.perf_counter()
        many()
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        det.stop()
        t5 = time.perf_counter()
        cost = {"ops": 5000, "body_unprofiled_s": t1 - t0, "start_s": t3 - t2,
                "body_profiled_s": t4 - t3, "stop_and_parse_s": t5 - t4}
        (out / "cost.json").write_text(json.dumps(cost, indent=1))
        print(cost)
    print("recorded", sorted(scenarios))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
