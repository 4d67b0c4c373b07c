"""Benchmark of gpucheck.ops.knn_mean_sq_dist on one GPU.

For N in 100k, 1M, 10M and every cloud of ``suites/knn/knn_clouds.py`` (k = 3 unless --k):
median time of one call with CUDA events (after warm-up; several input sets rotated so small
sizes do not just time the L2), its ratio to the uniform cloud's time at the same N (target:
at most 3), peak extra device memory per point (peak allocated during the call minus inputs
and output), growth of the time from 1M to 10M, and a spot check of 1000 random rows against
the float64 reference (rows that overflow float32 must be +inf). Usage:
``python benchmarks/knn.py [--sizes 100000,1000000] [--clouds uniform,sfm_far] [--json F]``;
``--budgets 256,2048`` repeats everything per walk budget (GPUCHECK_KNN_WALK_BUDGET).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "suites" / "knn"))

import knn_clouds  # noqa: E402

from gpucheck.ops import knn_mean_sq_dist  # noqa: E402
from gpucheck.reference import knn_mean_sq_dist as reference  # noqa: E402

# simple-knn distCUDA2 measured by us on an H200 (benchmarks/HISTORY.md, "Peers"), ms:
# (uniform, clustered).
PEER_MS = {100_000: (6.84, 6.06), 1_000_000: (28.3, 17.2), 10_000_000: (378.0, 355.0)}
TARGET_MS = {100_000: 1.0, 1_000_000: 5.0, 10_000_000: 60.0}
PEER_CLOUDS = ("uniform", "clusters")
RATIO_TARGET = 3.0  # every cloud within 3x the uniform time of the same N (issue: KNN outliers)


def time_ms(inputs: list[torch.Tensor], k: int, repeats: int) -> list[float]:
    """Per-call times (ms) with CUDA events, rotating over ``inputs``."""
    for x in inputs:  # warm-up: module load, allocator growth
        knn_mean_sq_dist(x, k)
    torch.cuda.synchronize()
    times = []
    for r in range(repeats):
        x = inputs[r % len(inputs)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        knn_mean_sq_dist(x, k)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def extra_bytes(x: torch.Tensor, k: int) -> int:
    """Peak device memory allocated during one call beyond its input and its output."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = knn_mean_sq_dist(x, k)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return peak - base - out.numel() * out.element_size()


def spot_check(x: torch.Tensor, k: int, rows: int = 1000) -> float:
    """Largest relative error of ``rows`` random rows against the float64 reference (a row that
    must overflow to +inf and does not counts as error 1; rows at the overflow edge are not
    judged)."""
    got = knn_mean_sq_dist(x, k)
    idx = torch.randperm(x.shape[0], device=x.device)[:rows]
    want = reference(x, k, rows=idx, chunk_elements=1 << 26)
    got = got[idx].double()
    over, edge = knn_clouds.overflow_rows(want, k)
    err = (got - want).abs() / want.clamp_min(1e-300)
    err[want == 0] = (got[want == 0] != 0).double()
    err[over] = (~torch.isposinf(got[over])).double()
    err[edge] = 0.0
    return float(err.max())


def kernel_breakdown(x: torch.Tensor, k: int) -> str:
    """Device time per kernel of one call (torch.profiler), largest first."""
    from torch.profiler import ProfilerActivity, profile

    knn_mean_sq_dist(x, k)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        knn_mean_sq_dist(x, k)
        torch.cuda.synchronize()
    return prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=12, max_name_column_width=60
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100000,1000000,10000000")
    parser.add_argument("--clouds", default=",".join(knn_clouds.CLOUDS))
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--budgets", default="", help="walk budgets to compare (default: built-in)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=0,
        help="timed calls per case (default: 50 up to 1M points, 20 above)",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--profile",
        default="",
        help="clouds whose per-kernel times at the largest size are printed",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    clouds = [c for c in args.clouds.split(",") if c]
    if "uniform" in clouds:  # first, so that every other cloud has its ratio
        clouds.remove("uniform")
        clouds.insert(0, "uniform")
    budgets = [b for b in args.budgets.split(",") if b] or [None]
    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    print(f"# {props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}, k={args.k}")

    rows = []
    for budget in budgets:
        if budget is None:
            os.environ.pop("GPUCHECK_KNN_WALK_BUDGET", None)
        else:
            os.environ["GPUCHECK_KNN_WALK_BUDGET"] = budget
        for cloud in clouds:
            for n in sizes:
                sets = 4 if n <= 1_000_000 else 1
                inputs = [knn_clouds.make(cloud, n, 1000 + s, dev) for s in range(sets)]
                repeats = args.repeats or (50 if n <= 1_000_000 else 20)
                times = time_ms(inputs, args.k, repeats)
                med = statistics.median(times)
                extra = extra_bytes(inputs[0], args.k)
                err = spot_check(inputs[0], args.k)
                row = {
                    "cloud": cloud,
                    "n": n,
                    "k": args.k,
                    "budget": budget,
                    "median_ms": med,
                    "min_ms": min(times),
                    "max_ms": max(times),
                    "repeats": repeats,
                    "extra_bytes_per_point": extra / n,
                    "max_rel_err_1000_rows": err,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
                del inputs
                torch.cuda.empty_cache()
            if cloud in args.profile.split(","):
                x = knn_clouds.make(cloud, max(sizes), 7, dev)
                try:
                    print(f"## kernels, {cloud} {max(sizes):,}\n{kernel_breakdown(x, args.k)}")
                except Exception as err:  # profiler unavailable on this machine
                    print(f"## kernel breakdown unavailable: {err}")
                del x
    os.environ.pop("GPUCHECK_KNN_WALK_BUDGET", None)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))

    print(
        "\n| cloud | N | budget | median ms | min–max ms | × uniform | target | simple-knn | "
        "extra B/pt | rel err |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    by = {(r["cloud"], r["n"], r["budget"]): r for r in rows}
    for r in rows:
        uni = by.get(("uniform", r["n"], r["budget"]))
        ratio = r["median_ms"] / uni["median_ms"] if uni else float("nan")
        target = TARGET_MS.get(r["n"], float("nan")) if r["cloud"] in PEER_CLOUDS else None
        peer = (
            PEER_MS.get(r["n"], (float("nan"),) * 2)[PEER_CLOUDS.index(r["cloud"])]
            if r["cloud"] in PEER_CLOUDS
            else None
        )
        flag = "" if ratio <= RATIO_TARGET else " (over 3×)"
        target_s = f"≤ {target:g}" if target else "—"
        print(
            f"| {r['cloud']} | {r['n']:,} | {r['budget'] or 'default'} | "
            f"{r['median_ms']:.3f} | "
            f"{r['min_ms']:.3f}–{r['max_ms']:.3f} | {ratio:.2f}{flag} | "
            f"{target_s} | {peer if peer else '—'} | "
            f"{r['extra_bytes_per_point']:.1f} | {r['max_rel_err_1000_rows']:.1e} |"
        )
    for budget in budgets:
        for cloud in clouds:
            a, b = by.get((cloud, 1_000_000, budget)), by.get((cloud, 10_000_000, budget))
            if a and b:
                print(
                    f"growth 1M -> 10M ({cloud}, budget {budget or 'default'}): "
                    f"x{b['median_ms'] / a['median_ms']:.2f} (linear: x10)"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
