"""What the numerics detector's fingerprint of one op call costs (``numerics`` in a record's
``cost_s``), on the arguments and results of the bundled ops.

    python benchmarks/fingerprint_cost.py [--device cuda|cpu] [--reps 200] [--json F]

The detector hashes the bits of every tensor an extension op takes (before the call) and
returns (after it), the first :data:`gpucheck.detectors.numerics.CAP` calls per signature of
a case: on a GPU under ``CUDA_LAUNCH_BLOCKING=1`` (how ``gpucheck run`` runs a case) every
kernel it launches is a round trip, so its cost is its kernels' count. Each row times
:func:`~gpucheck.detectors.numerics.fingerprint` of one tensor set shaped as a bundled op's
inputs or outputs (the sizes of the kernel suites' cases), medians of ``--reps`` (CUDA events
around each on a GPU, after a warm-up); ``per tensor`` is the median over the set's tensors
with data; ``GPU work`` is what one fingerprint of the set ran on a GPU, from kineto's
profiler after the timings: kernels + copies + memsets (the count the cost follows). Run it
under ``CUDA_LAUNCH_BLOCKING=1`` for the cost inside ``gpucheck run`` and without for the
cost's floor; the table is printed and written to ``--json`` with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

import torch

from gpucheck.detectors import numerics


def sets(device: str, n: int, side: int) -> dict[str, Any]:
    """Tensor sets shaped as the bundled ops' arguments and results (n Gaussians or points,
    side x side images)."""
    g = torch.Generator(device=device).manual_seed(0)

    def f(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g, device=device)

    def i(*shape: int) -> torch.Tensor:
        return torch.randint(0, 1 << 20, shape, generator=g, device=device, dtype=torch.int32)

    tiles = (side // 16) ** 2
    empty = torch.empty(0, device=device)
    return {
        "ssim_forward in (2 images)": (f(1, 3, side, side), f(1, 3, side, side), "valid", "mean"),
        "ssim_forward out (a scalar)": f(()),
        "knn_mean_sq_dist in (points)": (f(n, 3), 3),
        "knn_mean_sq_dist out": f(n),
        "splat_project in (8 tensors)": (
            *(f(n, 3), f(n, 3), f(n, 4), f(n), f(n, 3), f(4, 4), f(3, 3), f(3)),
            side,
            side,
            -1,
            None,
        ),
        "splat_project out (10 tensors)": (
            *(f(n, 2), f(n, 3), f(n, 3), f(n), i(n), i(n), i(tiles, 2), i(4 * n)),
            *(empty, empty),
        ),
        "splat_render out (5 tensors)": (
            *(f(3, side, side), f(1, side, side), f(1, side, side), f(side, side)),
            i(side, side),
        ),
    }


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be 1 or more")
    return value


def timed(fn: Callable[[], Any], reps: int, device: str) -> float:
    """Median microseconds of ``fn()`` over ``reps`` calls after a warm-up."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def gpu_work(fn: Callable[[], Any]) -> str:
    """What one ``fn()`` ran on the GPU, from kineto's profiler: ``kernels+copies+memsets``
    (``-`` where the profiler could not run)."""
    from torch.profiler import ProfilerActivity, profile

    try:
        from gpucheck.detectors.launch_trace import gpu_events  # BASE's, where it has one

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        events = gpu_events(prof.profiler.kineto_results)
    except Exception:
        return "-"
    kinds = Counter(e["type"] for e in events)
    return f"{kinds['kernel']}+{kinds['gpu_memcpy']}+{kinds['gpu_memset']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    ap.add_argument("--reps", type=positive, default=200)
    ap.add_argument("--n", type=positive, default=10_000, help="Gaussians or points")
    ap.add_argument("--side", type=positive, default=256, help="image side (16 or more)")
    ap.add_argument("--json", help="write the rows and the machine here")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "fingerprint_cost: no CUDA device visible (--device cpu measures the host)"
        )
    rows = []
    tensor_sets = sets(args.device, args.n, args.side)
    for name, obj in tensor_sets.items():
        tensors = [t for t in torch.utils._pytree.tree_leaves(obj) if isinstance(t, torch.Tensor)]
        with_data = [t for t in tensors if t.numel()]
        whole = timed(lambda o=obj: numerics.fingerprint(o), args.reps, args.device)
        each = statistics.median(
            timed(lambda t=t: numerics.fingerprint(t), args.reps, args.device) for t in with_data
        )
        rows.append(
            {
                "set": name,
                "tensors": len(with_data),
                "us": round(whole, 1),
                "us_per_tensor": round(each, 1),
            }
        )
    for row, obj in zip(rows, tensor_sets.values(), strict=True):
        # after every timing: CUPTI, once attached, may slow later launches
        row["gpu_work"] = (
            gpu_work(lambda o=obj: numerics.fingerprint(o)) if args.device == "cuda" else "-"
        )
    machine = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "CUDA_LAUNCH_BLOCKING": os.environ.get("CUDA_LAUNCH_BLOCKING", ""),
        "date": datetime.now().isoformat(timespec="seconds"),
        "n": args.n,
        "side": args.side,
        "reps": args.reps,
        "numerics": numerics.__file__,  # which checkout's fingerprint (BASE= in the step)
    }
    print(
        f"{machine['device']}, torch {machine['torch']}, CLB={machine['CUDA_LAUNCH_BLOCKING'] or 0}"
        f", {machine['numerics']}"
    )
    print(
        "| tensor set | tensors | fingerprint µs | a one-tensor fingerprint µs "
        "| GPU work (kernels+copies+memsets) |\n|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['set']} | {r['tensors']} | {r['us']} | {r['us_per_tensor']} | {r['gpu_work']} |"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
