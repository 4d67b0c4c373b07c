"""Benchmark of gpucheck.ops.rasterize (forward) on one GPU, plus its error against the oracle.

Timing: 1M random Gaussians (SH degree 3, screen radii of a few pixels, as in a trained scene)
rendered at 1920x1080: median of CUDA-event-timed calls after warm-up, peak extra device
memory, overlaps. Accuracy: the largest image / alpha / depth*alpha error against the float64
reference for a few small random scenes, and whether the radii agree. Usage:
``python benchmarks/splat.py [--n 1000000] [--repeats 30] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "suites" / "splat"))

import splat_scenes  # noqa: E402

from gpucheck.ops import rasterize  # noqa: E402
from gpucheck.reference import rasterize as reference  # noqa: E402

TARGET_MS = 4.0  # issue: 1M Gaussians at 1920x1080, forward


def timing(n: int, repeats: int, device: torch.device) -> dict[str, float]:
    args = splat_scenes.scene(n, 1920, 1080, 1234, device, sh_degree=3,
                              depth_range=(2.0, 30.0), log_scale=(-5.0, -3.0))
    for _ in range(3):
        out = rasterize(**args)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = rasterize(**args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    visible = out.radii[out.radii > 0].float()
    return {"n": n, "median_ms": statistics.median(times), "min_ms": min(times),
            "target_ms": TARGET_MS, "n_intersections": out.n_intersections,
            "visible": int(visible.numel()),
            "radius_p50": float(visible.median()) if visible.numel() else 0.0,
            "peak_extra_mib": (torch.cuda.max_memory_allocated(device) - base) / 2**20,
            "alpha_mean": float(out.alpha.mean())}


def accuracy(device: torch.device) -> list[dict[str, object]]:
    rows = []
    for seed, (n, w, h, deg) in enumerate([(300, 203, 113, None), (300, 203, 113, 3),
                                           (1500, 64, 48, None), (500, 128, 96, 1)]):
        args = splat_scenes.scene(n, w, h, seed, device, sh_degree=deg)
        got = rasterize(**args)
        ref = reference(**splat_scenes.to(args, "cpu"))
        err = {k: float((a.double().cpu() - b).abs().max()) for k, a, b in (
            ("image", got.image, ref.image), ("alpha", got.alpha, ref.alpha),
            ("depth_x_alpha", got.depth * got.alpha, ref.depth * ref.alpha))}
        rows.append({"scene": f"N={n} {h}x{w} sh={deg}", **err,
                     "radii_equal": bool(torch.equal(got.radii.cpu(), ref.radii)),
                     "overlaps_equal": got.n_intersections == ref.n_intersections})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    result = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "timing": timing(args.n, args.repeats, device), "accuracy": accuracy(device)}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
