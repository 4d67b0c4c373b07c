"""Benchmark of gpucheck.ops.rasterize (forward and backward) on one GPU, plus its error
against the oracle.

Timing: 100k / 1M / 3M random Gaussians (SH degree 3, depths 2-30, log-scales -5...-3: screen
radii of a few pixels, as in a trained scene) rendered at 1920x1080: medians of
CUDA-event-timed forward calls (no grad), backward calls (``image.backward(random grad)``
with means, scales, rotations, opacities and SH requiring grad) and whole training steps
(forward + backward), after warm-up; peak extra device memory of one training step; overlaps.
Accuracy: the largest image / alpha / depth*alpha error against the float64 reference for a
few small random scenes, and whether the radii agree. Usage:
``python benchmarks/splat.py [--n 100000 1000000] [--repeats 30] [--scene bench midtrain]
[--json F]`` (scenes: ``splat_scenes.BENCH_SCENES``; peak memory also split into the forward's
and the backward's, and the gradients' own bytes, which any renderer allocates);
``--profile N``: a per-kernel profile; ``--preflight``: the memory preflight's share of the
forward time. ``--dtype float32 bfloat16 float16``: the Gaussian parameters (and their
gradients) in each of these dtypes in turn, every scene and N timed in each, in one process
(the camera, the image and the per-Gaussian screen-space values stay float32);
``--interleave``: instead, the dtypes timed alternately call by call on the same scene (forward
and training step medians, and the median of the per-round ratios to the first dtype), so that
the machine's drift between calls falls on every dtype alike. ``--backward-pixels 2 4``: every
timing (and ``--profile``) once per layout of the render backward (pixels a thread,
``GPUCHECK_SPLAT_BACKWARD_PIXELS``; default: the build's own).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "suites" / "splat"))

import splat_scenes  # noqa: E402
from splat_grads import errors, gradients  # noqa: E402

from gpucheck.ops import rasterize  # noqa: E402
from gpucheck.reference import rasterize as reference  # noqa: E402

TARGET_MS = 4.0  # issue: 1M Gaussians at 1920x1080, forward
TARGET_STEP_MS = 12.0  # forward + backward
TARGET_PEAK_MIB = 1.5 * 1000**3 / 2**20
DIFFERENTIABLE = ("means", "scales", "rotations", "opacities", "sh")
#: Pixels a thread of the render backward walks (tuning: csrc/splat/splat.cpp)
BACKWARD_PIXELS_ENV = "GPUCHECK_SPLAT_BACKWARD_PIXELS"
Render = Callable[[dict[str, torch.Tensor]], torch.Tensor]


def use_backward_pixels(value: str | None) -> str:
    """Sets the render backward's pixels a thread for the calls that follow (None: as the
    environment has it); returns how the rows name it."""
    if value is not None:
        os.environ[BACKWARD_PIXELS_ENV] = value
    return os.environ.get(BACKWARD_PIXELS_ENV) or "default"


def _elapsed_ms(fn: Callable[[], Any]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _median_ms(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    times = [_elapsed_ms(fn) for _ in range(repeats)]
    return statistics.median(times), min(times)


def time_training(
    render: Render,
    params: dict[str, torch.Tensor],
    grad: torch.Tensor,
    repeats: int,
    device: torch.device,
) -> dict[str, float]:
    """Forward / backward / step medians (ms) and the peak extra memory of one step (MiB) of
    ``render`` (params -> image; gpucheck's or a peer's) with ``params`` requiring grad and
    ``image.backward(grad)`` as the loss."""
    leaves = {k: v.clone().requires_grad_() for k, v in params.items()}
    state: dict[str, torch.Tensor] = {}

    def forward() -> None:
        state["image"] = render(leaves)

    def backward() -> None:
        state["image"].backward(grad)

    def step() -> None:
        for leaf in leaves.values():
            leaf.grad = None
        forward()
        backward()

    for _ in range(3):
        step()
    torch.cuda.synchronize(device)
    for leaf in leaves.values():
        leaf.grad = None
    state.clear()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    # the same step in two phases: the forward's peak, and the backward's (with what the
    # forward left allocated); the gradients' own bytes, which every renderer allocates
    for leaf in leaves.values():
        leaf.grad = None
    state.clear()
    torch.cuda.reset_peak_memory_stats(device)
    forward()
    torch.cuda.synchronize(device)
    peak_fwd = torch.cuda.max_memory_allocated(device) - base
    torch.cuda.reset_peak_memory_stats(device)
    backward()
    torch.cuda.synchronize(device)
    peak_bwd = torch.cuda.max_memory_allocated(device) - base
    grad_bytes = sum(leaf.numel() * leaf.element_size() for leaf in leaves.values())
    with torch.no_grad():
        fwd = [_elapsed_ms(lambda: render(params)) for _ in range(repeats)]
    bwd = []
    for _ in range(repeats):
        for leaf in leaves.values():
            leaf.grad = None
        forward()
        bwd.append(_elapsed_ms(backward))
    steps = [_elapsed_ms(step) for _ in range(repeats)]
    finite = all(
        bool(torch.isfinite(leaf.grad).all()) for leaf in leaves.values() if leaf.grad is not None
    )
    state.clear()
    return {
        "forward_ms": statistics.median(fwd),
        "forward_min_ms": min(fwd),
        "backward_ms": statistics.median(bwd),
        "fwd_bwd_ms": statistics.median(steps),
        "peak_train_mib": peak / 2**20,
        "peak_forward_mib": peak_fwd / 2**20,
        "peak_backward_mib": peak_bwd / 2**20,
        "grads_mib": grad_bytes / 2**20,
        "grads_finite": finite,
        "image_mib": grad.numel() * grad.element_size() / 2**20,
    }


def timing(
    n: int,
    repeats: int,
    device: torch.device,
    width: int = 1920,
    height: int = 1080,
    kind: str = "bench",
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """Forward, backward and forward + backward medians, and peak memory of one training step
    (inputs that require grad, a loss on the image) on the ``kind`` scene
    (``splat_scenes.BENCH_SCENES``), its Gaussian parameters in ``dtype``."""
    args = splat_scenes.scene(n, width, height, 1234, device, **splat_scenes.BENCH_SCENES[kind])
    args = splat_scenes.to(args, device, dtype)

    def render(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return rasterize(**{**args, **p}).image

    params = {k: args[k] for k in DIFFERENTIABLE}
    times = time_training(
        render, params, torch.rand(3, height, width, device=device), repeats, device
    )
    out = rasterize(**args)
    visible = out.radii[out.radii > 0].float()
    return {
        "n": n,
        "scene": kind,
        "dtype": str(dtype).removeprefix("torch."),
        **times,
        "n_intersections": out.n_intersections,
        "visible": int(visible.numel()),
        "radius_p50": float(visible.median()) if visible.numel() else 0.0,
        "alpha_mean": float(out.alpha.mean()),
    }


def interleaved(
    n: int, repeats: int, device: torch.device, kind: str, dtypes: list[torch.dtype]
) -> list[dict[str, Any]]:
    """Forward (no grad) and training-step (forward + ``image.backward``) times of the ``kind``
    scene with its parameters in each of ``dtypes``, timed alternately: each round times one
    forward of every dtype, then one step of every dtype. Medians per dtype, and the median
    over rounds of each round's ratio to ``dtypes[0]``."""
    base = splat_scenes.scene(n, 1920, 1080, 1234, device, **splat_scenes.BENCH_SCENES[kind])
    grad = torch.rand(3, 1080, 1920, device=device)
    setups = {}
    for dtype in dtypes:
        args = splat_scenes.to(base, device, dtype)
        setups[dtype] = (args, {k: args[k].clone().requires_grad_() for k in DIFFERENTIABLE})

    def forward(dtype: torch.dtype) -> None:
        with torch.no_grad():
            rasterize(**setups[dtype][0])

    def step(dtype: torch.dtype) -> None:
        args, leaves = setups[dtype]
        for leaf in leaves.values():
            leaf.grad = None
        rasterize(**{**args, **leaves}).image.backward(grad)

    for dtype in dtypes:
        for _ in range(3):
            forward(dtype)
            step(dtype)
    fwd: dict[torch.dtype, list[float]] = {d: [] for d in dtypes}
    steps: dict[torch.dtype, list[float]] = {d: [] for d in dtypes}
    for _ in range(repeats):
        for dtype in dtypes:
            fwd[dtype].append(_elapsed_ms(functools.partial(forward, dtype)))
        for dtype in dtypes:
            steps[dtype].append(_elapsed_ms(functools.partial(step, dtype)))
    first = dtypes[0]
    return [
        {
            "scene": kind,
            "n": n,
            "dtype": str(d).removeprefix("torch."),
            "forward_ms": statistics.median(fwd[d]),
            "fwd_bwd_ms": statistics.median(steps[d]),
            "forward_ratio": statistics.median(
                a / b for a, b in zip(fwd[d], fwd[first], strict=True)
            ),
            "step_ratio": statistics.median(
                a / b for a, b in zip(steps[d], steps[first], strict=True)
            ),
            "repeats": repeats,
        }
        for d in dtypes
    ]


def accuracy(device: torch.device) -> list[dict[str, object]]:
    rows = []
    for seed, (n, w, h, deg) in enumerate(
        [(300, 203, 113, None), (300, 203, 113, 3), (1500, 64, 48, None), (500, 128, 96, 1)]
    ):
        args = splat_scenes.scene(n, w, h, seed, device, sh_degree=deg)
        got = rasterize(**args)
        ref = reference(**splat_scenes.to(args, "cpu"))
        err = {
            k: float((a.double().cpu() - b).abs().max())
            for k, a, b in (
                ("image", got.image, ref.image),
                ("alpha", got.alpha, ref.alpha),
                ("depth_x_alpha", got.depth * got.alpha, ref.depth * ref.alpha),
            )
        }
        rows.append(
            {
                "scene": f"N={n} {h}x{w} sh={deg}",
                **err,
                "radii_equal": bool(torch.equal(got.radii.cpu(), ref.radii)),
                "overlaps_equal": got.n_intersections == ref.n_intersections,
            }
        )
    return rows


def gradient_accuracy(device: torch.device, seeds: int = 3) -> dict[str, Any]:
    """Worst gradient errors against the float64 reference over a few random scenes and
    losses, and whether repeated backward passes agree bitwise."""
    scenes = [
        (300, 203, 113, None, {}),
        (300, 203, 113, 3, {}),
        (1500, 64, 48, None, {"log_scale": (-2.5, -1.0)}),
        (200, 64, 48, 2, {"depth_range": (-0.5, 4.0)}),
    ]
    worst: dict[str, dict[str, float]] = {}
    for s, (n, w, h, deg, kw) in enumerate(scenes):
        for seed in range(seeds):
            args = splat_scenes.scene(n, w, h, 100 * s + seed, device, sh_degree=deg, **kw)
            kernel, oracle = gradients(args, seed, extra=s == 3)
            for name, e in errors(kernel, oracle).items():
                into = worst.setdefault(name, dict.fromkeys(e, 0.0))
                for key, value in e.items():
                    into[key] = max(into[key], value)
    args = splat_scenes.scene(3000, 128, 96, 7, device, sh_degree=3, log_scale=(-3.5, -1.5))
    weights = torch.randn(3, 96, 128, device=device)
    runs = []
    for _ in range(5):
        leaves = {k: args[k].clone().requires_grad_() for k in DIFFERENTIABLE}
        (rasterize(**{**args, **leaves}).image * weights).sum().backward()
        runs.append({k: v.grad for k, v in leaves.items()})
    bitwise = all(torch.equal(r[k], runs[0][k]) for r in runs for k in DIFFERENTIABLE)
    spread = max(
        float((r[k] - runs[0][k]).abs().max() / runs[0][k].abs().max())
        for r in runs
        for k in DIFFERENTIABLE
    )
    return {"worst": worst, "repeat_bitwise": bitwise, "repeat_max_rel_diff": spread}


def profile(
    n: int,
    device: torch.device,
    steps: int = 10,
    kind: str = "bench",
    dtype: torch.dtype = torch.float32,
) -> str:
    """Per-kernel device time of ``steps`` training steps at ``n`` Gaussians (torch.profiler),
    as a table: where the forward and the backward spend their time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    args = splat_scenes.scene(n, 1920, 1080, 1234, device, **splat_scenes.BENCH_SCENES[kind])
    args = splat_scenes.to(args, device, dtype)
    leaves = {k: args[k].clone().requires_grad_() for k in DIFFERENTIABLE}
    grad_image = torch.rand(3, 1080, 1920, device=device)
    for _ in range(3):
        rasterize(**{**args, **leaves}).image.backward(grad_image)
    torch.cuda.synchronize(device)
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            for leaf in leaves.values():  # as time_training: no gradient accumulation
                leaf.grad = None
            rasterize(**{**args, **leaves}).image.backward(grad_image)
        torch.cuda.synchronize(device)
    table: str = prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=18, max_name_column_width=90
    )
    return table


def memory_at_peak(n: int, device: torch.device, kind: str = "midtrain", rows: int = 16) -> str:
    """What is allocated at the peak of one training step (``image.backward(grad)`` with
    every parameter requiring grad, grads set to None before it, as ``time_training``): the
    caching allocator's trace (torch.cuda.memory._record_memory_history), replayed to the
    moment of most bytes in use, and the blocks live then, largest first, each with the
    innermost frames of where it was allocated."""
    args = splat_scenes.scene(n, 1920, 1080, 1234, device, **splat_scenes.BENCH_SCENES[kind])
    leaves = {k: args[k].clone().requires_grad_() for k in DIFFERENTIABLE}
    grad = torch.rand(3, 1080, 1920, device=device)
    for _ in range(2):
        for leaf in leaves.values():
            leaf.grad = None
        rasterize(**{**args, **leaves}).image.backward(grad)
    for leaf in leaves.values():
        leaf.grad = None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="all")
    image = rasterize(**{**args, **leaves}).image
    image.backward(grad)
    torch.cuda.synchronize(device)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = snap["device_traces"][device.index]
    live: dict[int, dict[str, Any]] = {}
    used = best = 0
    at_peak: dict[int, dict[str, Any]] = {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            used += e["size"]
            if used > best:
                best, at_peak = used, dict(live)
        elif e["action"] == "free_requested" and e["addr"] in live:
            used -= live.pop(e["addr"])["size"]

    def where(e: dict[str, Any]) -> str:  # frames: innermost first
        frames = e.get("frames", [])
        ops = [
            f["name"]
            for f in frames
            if "gpucheck::" in f.get("name", "") or "AccumulateGrad" in f.get("name", "")
        ]
        py = [
            f"{Path(f['filename']).name}:{f['line']} {f['name']}"
            for f in frames
            if str(f.get("filename", "")).endswith(".py")
        ]
        return " | ".join([*(x[:70] for x in ops[:2]), *py[:3]])[:240]

    lines = [
        f"N={n} scene {kind}: peak {best / 2**20:.1f} MiB above the trace's start "
        f"(resident before the step: {base / 2**20:.1f} MiB)"
    ]
    for e in sorted(at_peak.values(), key=lambda e: -e["size"])[:rows]:
        lines.append(f"  {e['size'] / 2**20:8.2f} MiB  {where(e)}")
    return "\n".join(lines)


def preflight(n: int, device: torch.device, calls: int = 20) -> dict[str, Any]:
    """The memory preflight's cost at ``n`` Gaussians (no-grad forwards, torch.profiler).

    ``preflight_us``: host time of the preflight itself (free device memory, the sort's
    scratch size, the comparisons; the ``gpucheck::splat_preflight`` scope of splat.cpp),
    during which the GPU has nothing queued. ``turnaround_us``: the whole idle gap of the GPU
    between the end of the overlap scan and the start of the binning (the device-to-host read
    of the overlap count, which sizing the binning buffers needs in any case, the input
    validation, the preflight, the allocations and the launch); an upper bound. Shares are of
    the median forward time (measured without the profiler).
    """
    import tempfile

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    args = splat_scenes.scene(n, 1920, 1080, 1234, device, **splat_scenes.BENCH_SCENES["bench"])
    with torch.no_grad():
        for _ in range(3):
            rasterize(**args)
        fwd_ms, _ = _median_ms(lambda: rasterize(**args), 30)
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                rasterize(**args)
            torch.cuda.synchronize(device)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    scopes = [e["dur"] for e in events if e.get("name") == "gpucheck::splat_preflight"]
    kernels = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") == "kernel"
    )
    gaps = []
    scan_end = None
    for start, end, name in kernels:
        if "DeviceScanKernel" in name:
            scan_end = end
        elif "emit_kernel" in name and scan_end is not None:
            gaps.append(start - scan_end)
            scan_end = None
    pre_us = statistics.median(scopes) if scopes else float("nan")
    gap_us = statistics.median(gaps) if gaps else float("nan")
    return {
        "n": n,
        "forward_ms": fwd_ms,
        "preflight_us": pre_us,
        "preflight_calls": len(scopes),
        "preflight_share": pre_us / 1000 / fwd_ms,
        "turnaround_us": gap_us,
        "turnaround_share": gap_us / 1000 / fwd_ms,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000, 3_000_000])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--profile",
        type=int,
        metavar="N",
        help="only print a per-kernel profile of 10 training steps at N",
    )
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="only measure the memory preflight's share of the forward",
    )
    parser.add_argument(
        "--memory",
        type=int,
        metavar="N",
        help="only list what is allocated at the peak of a training step at N",
    )
    parser.add_argument(
        "--scene",
        nargs="+",
        default=["bench"],
        choices=sorted(splat_scenes.BENCH_SCENES),
        help="the scenes to time (splat_scenes.BENCH_SCENES)",
    )
    parser.add_argument(
        "--no-accuracy",
        action="store_true",
        help="timing only (no comparison with the float64 reference)",
    )
    parser.add_argument(
        "--dtype",
        nargs="+",
        default=["float32"],
        choices=["float32", "bfloat16", "float16"],
        help="the Gaussian parameters' dtypes to time, each in turn",
    )
    parser.add_argument(
        "--backward-pixels",
        nargs="+",
        choices=["2", "4"],
        help="time (or profile) once per render-backward layout: pixels a thread",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="time the dtypes alternately, call by call (ratios to the first)",
    )
    args = parser.parse_args()
    dtypes = [getattr(torch, d) for d in args.dtype]
    device = torch.device("cuda", torch.cuda.current_device())
    if args.interleave:
        rows = [
            r
            for kind in args.scene
            for n in args.n
            for r in interleaved(n, args.repeats, device, kind, dtypes)
        ]
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "device": torch.cuda.get_device_name(device),
                        "torch": torch.__version__,
                        "interleaved": rows,
                    },
                    indent=1,
                )
                + "\n"
            )
        print(
            f"{torch.cuda.get_device_name(device)}, dtypes timed alternately, {args.repeats} rounds"
        )
        print(
            f"{'scene':>8} {'N':>9} {'dtype':>8} {'fwd ms':>8} {'step ms':>8} "
            f"{'fwd / ' + args.dtype[0]:>16} {'step / ' + args.dtype[0]:>17}"
        )
        for r in rows:
            print(
                f"{r['scene']:>8} {r['n']:>9} {r['dtype']:>8} {r['forward_ms']:8.3f} "
                f"{r['fwd_bwd_ms']:8.3f} {r['forward_ratio']:16.3f} {r['step_ratio']:17.3f}"
            )
        return 0
    if args.memory:
        for kind in args.scene:
            print(memory_at_peak(args.memory, device, kind))
        return 0
    layouts = args.backward_pixels or [None]
    if args.profile:
        for kind in args.scene:
            for dtype in dtypes:
                for layout in layouts:
                    name = use_backward_pixels(layout)
                    print(f"== scene {kind}, N={args.profile}, {dtype}, backward pixels {name}")
                    print(profile(args.profile, device, kind=kind, dtype=dtype))
        return 0
    if args.preflight:
        rows = [preflight(n, device) for n in args.n]
        print(json.dumps(rows, indent=1))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
        for r in rows:
            print(
                f"N={r['n']}: forward {r['forward_ms']:.3f} ms, preflight "
                f"{r['preflight_us']:.1f} us ({100 * r['preflight_share']:.2f} %), "
                f"scan-to-binning turnaround {r['turnaround_us']:.1f} us "
                f"({100 * r['turnaround_share']:.2f} %)"
            )
        return 0
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "timing": [],
    }
    for kind in args.scene:
        for n in args.n:
            for dtype in dtypes:
                for layout in layouts:
                    name = use_backward_pixels(layout)
                    row = timing(n, args.repeats, device, kind=kind, dtype=dtype)
                    result["timing"].append({**row, "backward_pixels": name})
    if not args.no_accuracy:
        result["accuracy"] = accuracy(device)
        result["gradients"] = gradient_accuracy(device)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if not args.no_accuracy:
        grads = result["gradients"]
        print(
            f"gradients vs float64 reference (worst of 12 scenes): repeat bitwise "
            f"{grads['repeat_bitwise']}, repeat spread {grads['repeat_max_rel_diff']:.2g}"
        )
        for name, e in grads["worst"].items():
            print(
                f"  {name:>10}: rel_l2 {e['rel_l2']:.2e} max_rel {e['max_rel']:.2e} "
                f"share_over {e['share_over']:.3f}"
            )
        worst = {
            k: max(r[k] for r in result["accuracy"]) for k in ("image", "alpha", "depth_x_alpha")
        }
        print(
            "forward vs float64 reference (worst of 4 scenes): "
            + ", ".join(f"{k} {v:.2e}" for k, v in worst.items())
            + f"; radii equal {all(r['radii_equal'] for r in result['accuracy'])}"
        )
    print(
        f"{'scene':>8} {'N':>9} {'dtype':>8} {'bwd px':>7} {'fwd ms':>8} {'bwd ms':>8} "
        f"{'f+b ms':>8} {'peak MiB':>9} {'fwd pk':>7} {'bwd pk':>7} {'grads':>6} "
        f"{'overlaps':>10} finite"
    )
    for t in result["timing"]:
        print(
            f"{t['scene']:>8} {t['n']:>9} {t['dtype']:>8} {t['backward_pixels']:>7} "
            f"{t['forward_ms']:8.3f} {t['backward_ms']:8.3f} {t['fwd_bwd_ms']:8.3f} "
            f"{t['peak_train_mib']:9.1f} {t['peak_forward_mib']:7.1f} "
            f"{t['peak_backward_mib']:7.1f} {t['grads_mib']:6.1f} "
            f"{t['n_intersections']:>10} {t['grads_finite']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
