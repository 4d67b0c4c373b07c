"""Benchmark of the fused SSIM kernels on one GPU (issue 3; results in RESULTS.md).

For each size and dtype: inference (``train=False``, reduction mean) and train (forward +
backward of ``1 - ssim(img1, img2)`` with img1 requiring grad, as in 3DGS): median time over
>= 50 CUDA-event-timed runs after warm-up, inputs rotated so the working set exceeds the L2,
peak memory above the inputs, the fraction of the bandwidth floor, and the speed-up over the
PyTorch reference (gpucheck.reference.ssim) on the same GPU.

Bandwidth floor: bytes that must move (inference: read both images; train: forward reads
both, backward reads both and writes grad1) over the device-to-device copy rate measured in
the same run (bytes read + written per second).

Usage: ``python benchmarks/ssim.py [--json FILE] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable
from typing import Any

import torch

from gpucheck.ops.ssim_op import load_ops, ssim
from gpucheck.reference.ssim_torch import ssim as ref_ssim

SIZES = [(5, 3, 1080, 1920), (1, 3, 1080, 1920), (5, 1, 1500, 1500)]
# fused-ssim and the PyTorch conv2d SSIM, measured by us on one H200 (Nov 2026; see
# benchmarks/RESULTS.md, "Peers"): (inference, train) ms.
PEERS = {
    (5, 3, 1080, 1920): (0.573, 1.584),
    (1, 3, 1080, 1920): (0.133, 0.365),
    (5, 1, 1500, 1500): (0.227, 0.618),
}
TARGETS = {(5, 3, 1080, 1920): (0.15, 1.0), (1, 3, 1080, 1920): (0.04, 0.25)}


def time_ms(fn: Callable[[int], Any], reps: int, warmup: int) -> float:
    """Median of `reps` CUDA-event timings of fn(i) (i rotates the inputs)."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_rate(device: torch.device) -> float:
    """Device-to-device copy rate in bytes (read + write) per second, 2 GiB buffers."""
    n = 2**29
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda i: dst.copy_(src), reps=30, warmup=5)
    return 2 * n * 4 / (ms * 1e-3)


def rotation(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Enough input pairs that one pass over all of them is >= 4x the L2 (fresh random)."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    pair = 2 * math.prod(shape) * torch.finfo(dtype).bits // 8
    count = max(1, math.ceil(4 * l2 / pair))
    out = []
    for _ in range(count):
        x = torch.rand(shape, device=device)
        y = (0.7 * x + 0.3 * torch.rand(shape, device=device)).clamp(0, 1)
        out.append((x.to(dtype), y.to(dtype)))
    return out


def peak_mib(fn: Callable[[], Any], device: torch.device) -> float:
    """Peak memory (MiB) fn allocates above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def bench_case(impl: Callable[..., torch.Tensor], shape: tuple[int, ...], dtype: torch.dtype,
               device: torch.device, reps: int, warmup: int) -> dict[str, float]:
    sets = rotation(shape, dtype, device)
    leaves = [x.clone().requires_grad_(True) for x, _ in sets]

    def infer(i: int) -> torch.Tensor:
        x, y = sets[i % len(sets)]
        with torch.no_grad():
            return impl(x, y)

    def train(i: int) -> None:
        a = leaves[i % len(leaves)]
        a.grad = None
        loss = 1 - impl(a, sets[i % len(sets)][1])
        loss.backward()

    def backward_only(i: int) -> None:
        x, y = sets[i % len(sets)]
        torch.ops.gpucheck.ssim_backward(one, x, y, "same", "mean", False)

    one = torch.ones((), device=device, dtype=dtype)
    t_bwd = time_ms(backward_only, reps, warmup) if impl is ssim else float("nan")
    t_inf = time_ms(infer, reps, warmup)
    t_train = time_ms(train, reps, warmup)
    for a in leaves:
        a.grad = None
    mem_inf = peak_mib(lambda: infer(0), device)
    mem_train = peak_mib(lambda: train(0), device)
    return {"infer_ms": t_inf, "train_ms": t_train, "bwd_kernel_ms": t_bwd,
            "infer_peak_mib": mem_inf,
            "train_peak_mib": mem_train}


def check(shape: tuple[int, ...], device: torch.device) -> float:
    """|kernel - float64 reference| of the mean on one random pair (guards the timings)."""
    x = torch.rand(shape, device=device)
    y = (0.7 * x + 0.3 * torch.rand(shape, device=device)).clamp(0, 1)
    return abs(float(ssim(x, y)) - float(ref_ssim(x.double(), y.double())))


def profile_train(device: torch.device) -> int:
    """Print the kernels (and their GPU time) of 5 train steps: where train time goes."""
    sets = rotation(SIZES[0], torch.float32, device)
    leaves = [x.clone().requires_grad_(True) for x, _ in sets]

    def step(i: int) -> None:
        a = leaves[i % len(leaves)]
        a.grad = None
        (1 - ssim(a, sets[i % len(sets)][1])).backward()

    for i in range(5):
        step(i)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(5):
            step(i)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write all numbers to this file")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--profile", action="store_true",
                        help="only print the GPU kernels of 5 train steps (5x3x1080x1920 fp32)")
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    load_ops()
    if args.profile:
        return profile_train(device)
    reps, warmup = (20, 5) if args.quick else (60, 10)
    rate = copy_rate(device)
    props = torch.cuda.get_device_properties(device)
    print(f"device {props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"copy rate {rate / 1e12:.2f} TB/s (read+write), "
          f"L2 {props.L2_cache_size / 2**20:.0f} MiB")
    rows = []
    cases = [(s, torch.float32) for s in SIZES]
    cases += [(s, d) for s in SIZES[:2] for d in (torch.bfloat16, torch.float16)]
    for shape, dtype in cases:
        esize = torch.finfo(dtype).bits // 8
        image_bytes = math.prod(shape) * esize
        ours = bench_case(ssim, shape, dtype, device, reps, warmup)
        ref = (bench_case(lambda a, b: ref_ssim(a, b), shape, dtype, device, 20, 3)
               if dtype == torch.float32 else None)
        floor_inf = 2 * image_bytes / rate * 1e3
        floor_train = 5 * image_bytes / rate * 1e3
        row = {
            "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
            **ours,
            "infer_floor_frac": floor_inf / ours["infer_ms"],
            "train_floor_frac": floor_train / ours["train_ms"],
            "ref": ref,
            "abs_err_mean_vs_f64": check(shape, device) if dtype == torch.float32 else None,
        }
        if ref is not None:
            row["infer_speedup"] = ref["infer_ms"] / ours["infer_ms"]
            row["train_speedup"] = ref["train_ms"] / ours["train_ms"]
        rows.append(row)
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "torch": torch.__version__,
                       "cuda": torch.version.cuda, "copy_rate_Bps": rate, "rows": rows}, f,
                      indent=1)
    print("\n| size | dtype | infer ms | % floor | train ms | % floor | peak MiB inf/train |"
          " ref infer/train ms | speed-up inf/train | peer inf/train ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        shape = tuple(r["shape"])
        ref = r["ref"]
        peer = PEERS.get(shape) if r["dtype"] == "float32" else None
        print(
            f"| {'x'.join(map(str, shape))} | {r['dtype']} | {r['infer_ms']:.4f} | "
            f"{100 * r['infer_floor_frac']:.0f} % | {r['train_ms']:.4f} | "
            f"{100 * r['train_floor_frac']:.0f} % | "
            f"{r['infer_peak_mib']:.1f} / {r['train_peak_mib']:.1f} | "
            + (f"{ref['infer_ms']:.2f} / {ref['train_ms']:.2f} | "
               f"{r['infer_speedup']:.0f}x / {r['train_speedup']:.0f}x | " if ref else "- | - | ")
            + (f"{peer[0]} / {peer[1]} |" if peer else "- |")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
