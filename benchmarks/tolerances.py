"""How much of each SSIM and KNN test tolerance the kernels use, over many fresh seeds.

The checks are the suites' own, not copies: ``suites/ssim/test_ssim.py``'s
``forward_checks`` / ``backward_checks`` (each comparison with the float64 reference gives
its error and the bound it must stay under: float32/64 against ``MAP_TOL`` /
``GRAD_REL_TOL`` plus the rounding-sensitivity terms ``KAPPA_MAP`` / ``KAPPA_GRAD``, 16-bit
types against twice the float64 reference's error in that dtype plus ``LOWP_FLOOR``) on
both kinds of images (noise, smooth) and every dtype and size of its reference tests, and
``suites/knn/test_knn.py``'s ``judged_rows`` with ``rtol(k)`` (relative error against
``2 (k + 6) u``) on every cloud, size and k of its reference tests. Seeds come from
os.urandom and are recorded. (The splat tolerances: ``benchmarks/splat_tolerances.py``.)

For each family of checks (SSIM: dtype x images x forward map / forward mean / backward;
KNN: k) it prints the largest and the 99th percentile of ``err / bound``, the share of the
tolerance used: the test's margin is ``1 / share``, and a share near 1 is a flaky test; and
for SSIM float32/64 the largest rounding-sensitivity constant a check needed beyond its other
terms (``kappa``: against ``KAPPA_MAP`` / ``KAPPA_GRAD``). Writes every
record to ``--json``. ``--seconds`` bounds each kernel's run (rounds are taken until it is
spent). Usage: ``python benchmarks/tolerances.py [--kernels ssim knn] [--seconds 120]
[--json F]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "suites" / "ssim"))
sys.path.insert(0, str(ROOT / "suites" / "knn"))

import knn_clouds  # noqa: E402
import test_knn  # noqa: E402
import test_ssim  # noqa: E402

from gpucheck.kernels.ssim.op import load_ops  # noqa: E402
from gpucheck.ops import knn_mean_sq_dist  # noqa: E402
from gpucheck.reference import knn_mean_sq_dist as knn_reference  # noqa: E402
from gpucheck.testing import measure  # noqa: E402

Record = dict[str, Any]


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _record(
    kernel: str,
    family: str,
    case: str,
    seed: int,
    what: str,
    err: float,
    bound: float,
    relative: float = 0.0,
    unit: float = 0.0,
    kappa: float = 0.0,
) -> Record:
    share = err / bound if bound > 0 else (0.0 if err == 0 else math.inf)
    out = {
        "kernel": kernel,
        "family": family,
        "case": case,
        "seed": seed,
        "what": what,
        "err": err,
        "bound": bound,
        "share": share if math.isfinite(share) else "inf",
    }
    if unit > 0:  # the absolute term this check needed beyond its relative part, per unit
        out["abs_needed"] = max(0.0, err - relative) / unit if math.isfinite(err) else "inf"
    if kappa > 0:  # the rounding-sensitivity constant this check needed (SSIM float32/64)
        out["kappa_needed"] = kappa if math.isfinite(kappa) else "inf"
    return out


def ssim_round(device: torch.device) -> Iterator[Record]:
    """One seed for every kind of images, dtype, size and padding of the SSIM reference
    tests."""
    for images in test_ssim.IMAGES:
        for dtype in test_ssim.DTYPES:
            name = f"{str(dtype).removeprefix('torch.')} {images}"
            for shape in test_ssim.SIZES:
                seed = fresh_seed()
                with contextlib.redirect_stdout(io.StringIO()):  # _images prints the seed
                    x, y = test_ssim._images(shape, dtype, device, seed, kind=images)
                case = "x".join(map(str, shape))
                for padding in test_ssim._paddings(shape):
                    for c in test_ssim.forward_checks(x, y, padding):
                        part = c.what.split()[-1]  # map / mean
                        yield _record(
                            "ssim",
                            f"{name} forward {part}",
                            case,
                            seed,
                            c.what,
                            c.err,
                            c.bound,
                            kappa=c.kappa,
                        )
                    for reduction in ("none", "mean"):
                        for c in test_ssim.backward_checks(x, y, padding, reduction):
                            yield _record(
                                "ssim",
                                f"{name} backward",
                                case,
                                seed,
                                c.what,
                                c.err,
                                c.bound,
                                c.relative,
                                c.unit,
                                c.kappa,
                            )


def _knn_case(device: torch.device, cloud: str, n: int, k: int) -> Record:
    seed = fresh_seed()
    points = knn_clouds.make(cloud, n, seed, device)
    got = knn_mean_sq_dist(points, k)
    want = knn_reference(points, k, chunk_elements=test_knn.REF_CHUNK)
    what = f"{cloud} N={n} k={k}"
    got, want = test_knn.judged_rows(got, want, k, what)
    m = measure(got, want, rtol=test_knn.rtol(k), atol=0.0, what=what)
    return _record(
        "knn",
        f"k={k}",
        f"{cloud} N={n}",
        seed,
        "mean of the k smallest",
        m.max_rel,
        test_knn.rtol(k),
    )


def knn_round(device: torch.device) -> Iterator[Record]:
    """One seed for every cloud, size and k of the KNN reference tests."""
    clouds = (*test_knn.ISSUE_CLOUDS, "line", *test_knn.SFM_CLOUDS)
    for cloud in clouds:
        for k in test_knn.KS:
            for n in test_knn.SMALL_SIZES:
                yield _knn_case(device, cloud, test_knn.size(n, k), k)
            yield _knn_case(device, cloud, 100_000, k)
    for k in range(1, 17):
        yield _knn_case(device, "clusters", 3000, k)


ROUNDS: dict[str, Callable[[torch.device], Iterator[Record]]] = {
    "ssim": ssim_round,
    "knn": knn_round,
}


def _num(v: Any) -> float:
    return math.inf if v == "inf" else float(v)


def _share(r: Record) -> float:
    return _num(r["share"])


def summarize(records: list[Record]) -> dict[str, dict[str, Any]]:
    """Per kernel and family: the largest and 99th-percentile share, the largest error, the
    worst case (with its seed) and the number of checks."""
    families: dict[str, list[Record]] = {}
    for r in records:
        families.setdefault(f"{r['kernel']} {r['family']}", []).append(r)
    out = {}
    for key, rows in families.items():
        shares = sorted(_share(r) for r in rows)
        worst = max(rows, key=_share)
        out[key] = {
            "max_share": shares[-1],
            "p99_share": shares[min(len(shares) - 1, math.ceil(0.99 * len(shares)) - 1)],
            "max_err": max(float(r["err"]) for r in rows),
            "checks": len(rows),
            "worst": {k: worst[k] for k in ("case", "what", "seed", "err", "bound")},
        }
        needed = [_num(r["abs_needed"]) for r in rows if "abs_needed" in r]
        if needed:
            out[key]["max_abs_needed"] = max(needed)
        kappas = [_num(r["kappa_needed"]) for r in rows if "kappa_needed" in r]
        if kappas:
            out[key]["max_kappa_needed"] = max(kappas)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kernels", nargs="+", choices=sorted(ROUNDS), default=["ssim", "knn"])
    parser.add_argument("--seconds", type=float, default=120.0, help="per kernel")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    load_ops()
    records: list[Record] = []
    rounds: dict[str, int] = {}
    for kernel in args.kernels:
        start, rounds[kernel] = time.perf_counter(), 0
        while time.perf_counter() - start < args.seconds:
            records.extend(ROUNDS[kernel](device))
            rounds[kernel] += 1
    summary = summarize(records)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "rounds": rounds,
        "summary": summary,
        "records": records,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['device']}, torch {result['torch']}, rounds {rounds}")
    print(
        f"{'family':33} {'max share':>9} {'p99':>7} {'max err':>9} {'abs need':>8} "
        f"{'kappa':>6} {'checks':>6}  worst"
    )
    for key, s in summary.items():
        w, need, kappa = s["worst"], s.get("max_abs_needed"), s.get("max_kappa_needed")
        print(
            f"{key:33} {s['max_share']:9.3g} {s['p99_share']:7.3g} {s['max_err']:9.3g} "
            f"{'-' if need is None else format(need, '8.2g'):>8} "
            f"{'-' if kappa is None else format(kappa, '6.3g'):>6} {s['checks']:6d}  "
            f"{w['case']} {w['what']} seed={w['seed']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
