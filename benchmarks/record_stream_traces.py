"""Record the profiler events the wrong-stream detector reads, on a GPU, as CPU-test fixtures.

Usage (on a machine with a CUDA GPU, after ``pip install --no-build-isolation -e .`` with
GPUCHECK_KERNELS including ssim; knn is used when built)::

    python benchmarks/record_stream_traces.py OUT_DIR

Writes OUT_DIR/<scenario>.json: {"scenario", "recorded_on", "current_stream", "events"}, the
events being exactly what the detector gets from :func:`wrong_stream.plain_events`, with
the poisoned stream of the harness current on cuda:0. Also OUT_DIR/activity_types.json: every
kineto activity type seen, with an example (what the profiler offers besides).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from gpucheck import _csrc
from gpucheck.detectors.base import CaseInfo
from gpucheck.detectors.wrong_stream import WrongStreamDetector, activity_type
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
            events = det.stop()
            (out / f"{name}.json").write_text(json.dumps({
                "scenario": name, "doc": fn.__doc__,
                "recorded_on": f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}",
                "current_stream": repr(stream), "events": events}, indent=0))
        # every activity type the profiler reports, for the record
        from torch.autograd.profiler import _disable_profiler, _enable_profiler

        det = WrongStreamDetector()
        config, acts = det._config(torch)
        _enable_profiler(config, acts)
        legacy_stream_ssim()
        torch.cuda.synchronize()
        seen: dict[str, Any] = {}
        for e in _disable_profiler().events():
            seen.setdefault(f"{activity_type(e)}/{e.device_type()}", {
                "name": e.name(), "device_type": str(e.device_type()),
                "device_index": e.device_index(), "device_resource_id": e.device_resource_id(),
                "correlation_id": e.correlation_id(),
                "linked_correlation_id": e.linked_correlation_id(),
                "is_user_annotation": e.is_user_annotation()})
        seen["cuda_streams"] = {"poisoned": stream.cuda_stream,
                                "default": torch.cuda.default_stream(dev).cuda_stream}
        (out / "activity_types.json").write_text(json.dumps(seen, indent=1))
    print("recorded", sorted(scenarios))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
