"""Benchmark of the fused SSIM kernels on one GPU (results in RESULTS.md).

For each size and dtype: inference (``train=False``, reduction mean) and train (forward +
backward of ``1 - ssim(img1, img2)`` with img1 requiring grad, as in 3DGS):

* time: median of >= 50 CUDA-event-timed calls after warm-up, inputs rotated so that the
  working set exceeds the L2 (fresh random data);
* % floor: bytes that must move over the device-to-device copy rate measured in the same run
  (bytes read + written per second); inference reads both images, train reads both images
  twice (forward, backward) and writes grad1: 5 image-sizes;
* kernel: GPU time of the call's kernels from torch.profiler (sum of kernel durations per
  call), and host = time - kernel: how long the GPU waits for the host in a call;
* enqueue: host (CPU) time to issue one call, with no synchronisation;
* peak: ``max_memory_allocated`` above the inputs (train: includes the gradient of img1).

With ``--peer``, fused-ssim (``import fused_ssim``: the peer, installed from its sources) is
timed in the same process on the same inputs, float32 rows, in rounds that alternate ours and
the peer's (median of the rounds; the ratio is the median of each round's ratio), and issue 61's
training target is judged on those numbers instead of the recorded ones.

Usage: ``python benchmarks/ssim.py [--json FILE] [--quick] [--ref] [--peer] [--profile | --host]
[--shape BxCxHxW]``
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import gpucheck
from gpucheck.kernels.ssim.op import load_ops, ssim
from gpucheck.kernels.ssim.reference import ssim as ref_ssim

SIZES = [(5, 3, 1080, 1920), (1, 3, 1080, 1920), (5, 1, 1500, 1500)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# fused-ssim, measured by us on one H200 (Nov 2026; HISTORY.md, "Peers"): (inference, train).
PEERS: dict[tuple[int, ...], tuple[float, float]] = {
    (5, 3, 1080, 1920): (0.573, 1.584),
    (1, 3, 1080, 1920): (0.133, 0.365),
    (5, 1, 1500, 1500): (0.227, 0.618),
}
# Issue 61's targets per card model: float32 inference of 5x3x1080x1920 at >= this share of the
# read floor (the two images at half the read+write copy rate), and training steps >= 2x as
# fast as fused-ssim's, measured side by side on that card model (fused-ssim's train ms by
# shape: one H100, 2026-12-07; one H200, 2026-11-28).
TARGETS: dict[str, tuple[float, dict[tuple[int, ...], float]]] = {
    "H100": (0.75, {(5, 3, 1080, 1920): 1.824, (1, 3, 1080, 1920): 0.529}),
    "H200": (0.60, {(5, 3, 1080, 1920): 1.753, (1, 3, 1080, 1920): 0.608}),
}


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


def enqueue_us(fn: Callable[[int], Any], reps: int) -> float:
    """Median host time (µs) to issue fn(i), the GPU idle before each call."""
    times = []
    for i in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return 1e6 * statistics.median(times)


def kernel_ms(fn: Callable[[int], Any], calls: int) -> tuple[float, dict[str, float]]:
    """GPU time per call of fn's kernels (torch.profiler), and per kernel name (ms/call)."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(calls):
            fn(i)
        torch.cuda.synchronize()
    per_name: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name.replace("(anonymous namespace)::", "").split("<")[0]
            name = name.removeprefix("void ").split("::")[-1][:40]
            per_name[name] = per_name.get(name, 0.0) + e.time_range.elapsed_us() / 1e3 / calls
    return sum(per_name.values()), per_name


def copy_rate(device: torch.device) -> float:
    """Device-to-device copy rate in bytes (read + write) per second, 2 GiB buffers."""
    n = 2**29
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda i: dst.copy_(src), reps=30, warmup=5)
    return 2 * n * 4 / (ms * 1e-3)


def rotation(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Enough input pairs that one pass over all of them is >= 4x the L2 (fresh random)."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    pair = 2 * math.prod(shape) * torch.finfo(dtype).bits // 8
    count = max(2, math.ceil(4 * l2 / pair))
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


def calls(
    impl: Callable[..., torch.Tensor],
    sets: list[tuple[torch.Tensor, torch.Tensor]],
    leaves: list[torch.Tensor],
) -> tuple[Callable[[int], torch.Tensor], Callable[[int], None]]:
    """fn(i) for inference (``impl(x, y, train=False)``) and for the training step (forward and
    backward of ``1 - impl(a, y)``, a a leaf clone of x), the inputs rotated by i."""

    def infer(i: int) -> torch.Tensor:
        x, y = sets[i % len(sets)]
        return impl(x, y, train=False)

    def train(i: int) -> None:
        a = leaves[i % len(leaves)]
        a.grad = None
        (1 - impl(a, sets[i % len(sets)][1])).backward()

    return infer, train


def bench_case(
    impl: Callable[..., torch.Tensor],
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    reps: int,
    warmup: int,
    detail: bool = True,
) -> dict[str, Any]:
    """Time, kernel time, host enqueue time and peak memory of inference and train."""
    sets = rotation(shape, dtype, device)
    leaves = [x.clone().requires_grad_(True) for x, _ in sets]
    infer, train = calls(impl, sets, leaves)

    out: dict[str, Any] = {
        "infer_ms": time_ms(infer, reps, warmup),
        "train_ms": time_ms(train, reps, warmup),
    }
    if detail:
        out["infer_kernel_ms"], out["infer_kernels"] = kernel_ms(infer, 20)
        out["train_kernel_ms"], out["train_kernels"] = kernel_ms(train, 20)
        out["infer_enqueue_us"] = enqueue_us(infer, 30)
        out["train_enqueue_us"] = enqueue_us(train, 30)
    for a in leaves:
        a.grad = None
    out["infer_peak_mib"] = peak_mib(lambda: infer(0), device)
    out["train_peak_mib"] = peak_mib(lambda: train(0), device)
    return out


def load_peer() -> Callable[..., torch.Tensor]:
    """fused-ssim's loss as ``impl(x, y, train=...)`` (its mean SSIM); SystemExit with a clear
    message where it is not installed."""
    try:
        from fused_ssim import fused_ssim
    except ImportError as exc:
        raise SystemExit(
            f"--peer: fused-ssim is not importable ({exc}); install it from its sources"
        ) from None

    def peer(x: torch.Tensor, y: torch.Tensor, train: bool = True) -> torch.Tensor:
        return fused_ssim(x, y, train=train)

    return peer


def side_by_side(
    peer: Callable[..., torch.Tensor],
    shape: tuple[int, ...],
    device: torch.device,
    reps: int,
    rounds: int = 5,
) -> dict[str, Any]:
    """Ours and the peer on the same float32 inputs, `rounds` alternating rounds of `reps`
    CUDA-event-timed calls each (inference, then the training step of ``1 - ssim``): medians of
    the rounds' medians, the median of each round's peer / ours ratio, and |ours - peer| of the
    mean on one pair (the two compute the same function: a guard on the timings)."""
    sets = rotation(shape, torch.float32, device)
    leaves = [x.clone().requires_grad_(True) for x, _ in sets]
    ours, theirs = calls(ssim, sets, leaves), calls(peer, sets, leaves)
    out: dict[str, Any] = {"rounds": rounds}
    for which, kind in enumerate(("infer", "train")):
        ours_t, peer_t = [], []
        for _ in range(rounds):
            ours_t.append(time_ms(ours[which], reps, 5))
            peer_t.append(time_ms(theirs[which], reps, 5))
        out[f"{kind}_ms"] = statistics.median(ours_t)
        out[f"peer_{kind}_ms"] = statistics.median(peer_t)
        out[f"{kind}_ratio"] = statistics.median(p / o for o, p in zip(ours_t, peer_t, strict=True))
    x, y = sets[0]
    out["abs_diff_vs_peer"] = abs(float(ssim(x, y, train=False)) - float(peer(x, y, train=False)))
    for a in leaves:
        a.grad = None
    return out


def autograd_floor(device: torch.device) -> tuple[float, float]:
    """Host time (µs) to issue ``(1 - a.sum()).backward()`` on a small CUDA leaf, and the
    step's CUDA-event time (ms, as the train column is timed): the autograd engine's own cost
    per step on this machine (hand-over to its device thread and back), which no SSIM
    implementation can avoid; a train step is never faster than it."""
    a = torch.rand(1024, device=device, requires_grad=True)

    def step(i: int) -> None:
        a.grad = None
        (1 - a.sum()).backward()

    for i in range(10):
        step(i)
    return enqueue_us(step, 50), time_ms(step, reps=50, warmup=5)


def check(shape: tuple[int, ...], device: torch.device) -> float:
    """|kernel - float64 reference| of the mean on one random pair (guards the timings)."""
    x = torch.rand(shape, device=device)
    y = (0.7 * x + 0.3 * torch.rand(shape, device=device)).clamp(0, 1)
    return abs(float(ssim(x, y)) - float(ref_ssim(x.double(), y.double())))


def profile_train(device: torch.device, shape: tuple[int, ...]) -> int:
    """Print the profiler table of 5 train steps: where train time goes."""
    sets = rotation(shape, torch.float32, device)
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


def host_breakdown(device: torch.device, shape: tuple[int, ...], rounds: int = 200) -> int:
    """Print the host time (µs: median, 10th and 90th percentile of `rounds`, the GPU idle
    before each call) of the pieces of one fp32 training step, measured interleaved so that
    the machine's drift hits all alike: where the step's host time goes."""
    x, y = rotation(shape, torch.float32, device)[0]
    a = x.clone().requires_grad_(True)
    small = torch.rand(1024, device=device, requires_grad=True)
    fwd = load_ops()
    train_op = torch.ops.gpucheck.ssim_train.default

    def step(f: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            a.grad = None
            small.grad = None
            (1 - f()).backward()

        return run

    def single_thread(f: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            with torch.autograd.set_multithreading_enabled(False):
                f()

        return run

    pieces: dict[str, Callable[[], Any]] = {
        "engine floor: (1 - s.sum()).backward(), s 1024 floats": step(lambda: small.sum()),
        "engine floor on the image: (1 - a.sum()).backward()": step(lambda: a.sum()),
        "ssim(x, y, train=False) (inference)": lambda: ssim(x, y, train=False),
        "op, no graph: ssim_train(x, y)": lambda: train_op(x, y, "same", 1.0, False),
        "op with graph: ssim_forward(a, y)": lambda: fwd(a, y, "same", "mean"),
        "ssim(a, y) (forward, graph recorded)": lambda: ssim(a, y),
        "step through the op: (1 - ssim_forward(a, y)).backward()": step(
            lambda: fwd(a, y, "same", "mean")
        ),
        "step: (1 - ssim(a, y)).backward()": step(lambda: ssim(a, y)),
        # Diagnostics, not a way to run: the engine on the calling thread (no hand-over to its
        # device thread and back), which shows what that hand-over costs on this machine.
        "engine floor, autograd multithreading off": single_thread(step(lambda: small.sum())),
        "step, autograd multithreading off": single_thread(step(lambda: ssim(a, y))),
    }
    times: dict[str, list[float]] = {k: [] for k in pieces}
    for r in range(rounds + 10):
        for name, fn in pieces.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            t1 = time.perf_counter()
            if r >= 10:
                times[name].append(1e6 * (t1 - t0))
    torch.cuda.synchronize()
    print(
        f"host time per call, µs, {rounds} interleaved rounds, {'x'.join(map(str, shape))} float32:"
    )
    print("| piece | median | p10 | p90 |\n|---|---|---|---|")
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=10)
        print(f"| {name} | {statistics.median(ts):.1f} | {q[0]:.1f} | {q[-1]:.1f} |")
    return 0


def print_targets(rows: list[dict[str, Any]], rate: float, card: str) -> None:
    """Print issue 61's target lines for this card model (float32 rows), met or not."""
    model = next((m for m in TARGETS if m in card), None)
    if model is None:
        print(f"\nno issue-61 targets for {card} (H100 and H200 only)")
        return
    floor_share, fused_train = TARGETS[model]
    print(f"\nissue-61 targets ({model}):")
    for r in rows:
        shape = tuple(r["shape"])
        if r["dtype"] != "float32":
            continue
        name = "x".join(map(str, shape))
        if shape == (5, 3, 1080, 1920):
            floor = 2 * math.prod(shape) * 4 / (rate / 2) * 1e3
            share = floor / r["infer_ms"]
            met = "met" if share >= floor_share else "MISSED"
            print(
                f"  {name} float32 inference {r['infer_ms']:.3f} ms = {100 * share:.0f} % of the "
                f"read floor {floor:.3f} ms; target >= {100 * floor_share:.0f} %: {met}"
            )
        side = r.get("peer")
        if side is not None:
            met = "met" if side["train_ratio"] >= 2 else "MISSED"
            print(
                f"  {name} float32 train {side['train_ms']:.3f} ms = {side['train_ratio']:.2f}x "
                f"fused-ssim ({side['peer_train_ms']:.3f} ms in this process, median of "
                f"{side['rounds']} alternating rounds); target >= 2x: {met}"
            )
            continue
        fused = fused_train.get(shape)
        if fused is not None:
            ratio = fused / r["train_ms"]
            met = "met" if ratio >= 2 else "MISSED"
            print(
                f"  {name} float32 train {r['train_ms']:.3f} ms = {ratio:.2f}x fused-ssim "
                f"({fused} ms on an {model}); target >= 2x: {met}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write all numbers to this file")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--ref", action="store_true", help="also time the PyTorch reference (fp32 rows)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="only print the profiler table of 5 train steps (fp32)",
    )
    parser.add_argument(
        "--host",
        action="store_true",
        help="only print the host-time breakdown of a train step (fp32)",
    )
    parser.add_argument(
        "--peer",
        action="store_true",
        help="also time fused-ssim (installed) side by side in this process (fp32 rows)",
    )
    parser.add_argument("--shape", default=None, help="only this shape, e.g. 1x3x1080x1920")
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    load_ops()
    sizes = SIZES if args.shape is None else [tuple(int(v) for v in args.shape.split("x"))]
    if args.profile:
        return profile_train(device, sizes[0])
    if args.host:
        return host_breakdown(device, sizes[0])
    peer = load_peer() if args.peer else None
    reps, warmup = (20, 5) if args.quick else (60, 10)
    rate = copy_rate(device)
    props = torch.cuda.get_device_properties(device)
    floor_us, floor_ms = autograd_floor(device)
    print(
        f"device {props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"copy rate {rate / 1e12:.2f} TB/s (read+write), "
        f"L2 {props.L2_cache_size / 2**20:.0f} MiB, "
        f"autograd floor {floor_us:.0f} µs per backward() call ({floor_ms:.3f} ms "
        f"event-timed), gpucheck from {Path(gpucheck.__file__).parent}"
    )
    rows = []
    cases = [(s, d) for s in sizes for d in DTYPES if s[1] == 3 or d == torch.float32]
    for shape, dtype in cases:
        image_bytes = math.prod(shape) * torch.finfo(dtype).bits // 8
        ours = bench_case(ssim, shape, dtype, device, reps, warmup)
        ref = (
            bench_case(
                lambda a, b, train=True: ref_ssim(a, b), shape, dtype, device, 20, 3, detail=False
            )
            if args.ref and dtype == torch.float32
            else None
        )
        row = {
            "shape": list(shape),
            "dtype": str(dtype).replace("torch.", ""),
            **ours,
            "infer_floor_frac": 2 * image_bytes / rate * 1e3 / ours["infer_ms"],
            "train_floor_frac": 5 * image_bytes / rate * 1e3 / ours["train_ms"],
            "ref": ref,
            "abs_err_mean_vs_f64": check(shape, device) if dtype == torch.float32 else None,
            "peer": (
                side_by_side(peer, shape, device, max(reps, 40))
                if peer is not None and dtype == torch.float32
                else None
            ),
        }
        rows.append(row)
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": props.name,
                    "torch": torch.__version__,
                    "cuda": torch.version.cuda,
                    "copy_rate_Bps": rate,
                    "autograd_floor_us": floor_us,
                    "autograd_floor_ms": floor_ms,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    print(
        "\n| size | dtype | infer ms | % floor | kernel ms | host ms | enqueue µs | train ms |"
        " % floor | kernel ms | host ms | enqueue µs | peak MiB inf / train |"
        " fused-ssim inf / train ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        shape = tuple(r["shape"])
        side = r.get("peer")
        recorded = PEERS.get(shape) if r["dtype"] == "float32" else None
        fused = (
            f"{side['peer_infer_ms']:.3f} / {side['peer_train_ms']:.3f} (this process; ours "
            f"{side['infer_ms']:.3f} / {side['train_ms']:.3f}: {side['infer_ratio']:.2f}x / "
            f"{side['train_ratio']:.2f}x)"
            if side
            else (f"{recorded[0]} / {recorded[1]} (recorded)" if recorded else "-")
        )
        cells = [
            "x".join(map(str, shape)),
            r["dtype"],
            f"{r['infer_ms']:.3f}",
            f"{100 * r['infer_floor_frac']:.0f} %",
            f"{r['infer_kernel_ms']:.3f}",
            f"{r['infer_ms'] - r['infer_kernel_ms']:.3f}",
            f"{r['infer_enqueue_us']:.0f}",
            f"{r['train_ms']:.3f}",
            f"{100 * r['train_floor_frac']:.0f} %",
            f"{r['train_kernel_ms']:.3f}",
            f"{r['train_ms'] - r['train_kernel_ms']:.3f}",
            f"{r['train_enqueue_us']:.0f}",
            f"{r['infer_peak_mib']:.1f} / {r['train_peak_mib']:.1f}",
            fused,
        ]
        print("| " + " | ".join(cells) + " |")
    print_targets(rows, rate, props.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
