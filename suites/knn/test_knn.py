"""GPU suite of ``gpucheck.ops.knn_mean_sq_dist`` (failure 2 of docs/failures.md).

Every test runs on each target device with *another* device current (``gpu_device``), so a
missing device guard crashes or computes on the wrong GPU, and a leaked ``cudaSetDevice`` (the
published fix of story 2) shows as a changed current device.

Tolerance. The op returns the mean of the k smallest float32 squared distances, each computed
from float32 coordinate differences: one rounding in each difference, one in each square or
fused multiply-add, i.e. at most ~6 units of roundoff u = 2^-24 relative per distance (all
terms are non-negative, so nothing cancels). Swapping near-tied neighbours cannot move the
k-th order statistics by more than that same relative amount, and the float32 sum and
division add k more. So |op - ref| <= (k + 6) u |ref| against the float64 oracle; we allow
twice that (rtol = 2 (k + 6) u, 1.1e-6 for k = 3) and atol = 0, so exact zeros (duplicates)
must come out exactly zero.

Overflow. Squared distances are float32: points ~1e19 or more apart (the ``sfm_extreme``
cloud has coordinates of +-3e38) have +inf distances, and a result whose float32 sum of the k
smallest leaves the float32 range is +inf (``knn_clouds.overflow_rows``): such rows must be
+inf, rows within 1e-5 of that edge are not judged, all others as above.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import knn_clouds
import pytest
import torch

from gpucheck.ops import knn_mean_sq_dist
from gpucheck.reference import knn_mean_sq_dist as reference
from gpucheck.testing import assert_close, check_dtypes

pytestmark = [pytest.mark.gpu, pytest.mark.gpucheck_kernels]

U = 2.0**-24
KS = (1, 3, 16)
# k + 1 (smallest legal), 33 (partial last leaf), 1000, 1025 (two tree levels + partial leaf).
SMALL_SIZES = ("k+1", 33, 1000, 1025)
ISSUE_CLOUDS = ("uniform", "clusters", "planar", "duplicates", "offset")
SFM_CLOUDS = knn_clouds.SFM_CLOUDS
REF_CHUNK = 1 << 26


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def rtol(k: int) -> float:
    return 2 * (k + 6) * U


def judged_rows(
    got: torch.Tensor, want: torch.Tensor, k: int, what: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of ``got`` (float32 op) and ``want`` (float64 reference) that the tolerance
    judges, after asserting that rows which overflow are +inf (rows at the edge are left out).
    ``benchmarks/tolerances.py`` measures the error of these rows over many seeds."""
    over, edge = knn_clouds.overflow_rows(want, k)
    assert bool(torch.isposinf(got[over]).all()), f"{what}: rows that overflow must be +inf"
    ok = ~(over | edge)
    return got[ok], want[ok]


def assert_matches(got: torch.Tensor, want: torch.Tensor, k: int, what: str) -> None:
    """``got`` (float32 op) against ``want`` (float64 reference), overflow rules included."""
    got, want = judged_rows(got, want, k, what)
    # measured errors go into the case record (and into a numerics finding on failure)
    assert_close(got, want, rtol=rtol(k), atol=0.0, what=what)


def check_against_reference(points: torch.Tensor, k: int, what: str) -> torch.Tensor:
    got = knn_mean_sq_dist(points, k)
    assert got.shape == (points.shape[0],) and got.dtype == torch.float32
    assert got.device == points.device
    want = reference(points, k, chunk_elements=REF_CHUNK)
    assert_matches(got, want, k, what)
    return got


def size(n: int | str, k: int) -> int:
    return k + 1 if n == "k+1" else int(n)


@pytest.mark.sanitizer
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("n", SMALL_SIZES)
@pytest.mark.parametrize("cloud", (*ISSUE_CLOUDS, "line", *SFM_CLOUDS))
def test_matches_reference_small(
    gpu_device: torch.device, cloud: str, n: int | str, k: int
) -> None:
    seed = fresh_seed()
    points = knn_clouds.make(cloud, size(n, k), seed, gpu_device)
    check_against_reference(points, k, f"{cloud} N={size(n, k)} k={k} seed={seed}")


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("cloud", (*ISSUE_CLOUDS, "line", *SFM_CLOUDS))
def test_matches_reference_100k(gpu_device: torch.device, cloud: str, k: int) -> None:
    seed = fresh_seed()
    points = knn_clouds.make(cloud, 100_000, seed, gpu_device)
    check_against_reference(points, k, f"{cloud} N=100000 k={k} seed={seed}")


@pytest.mark.parametrize("k", range(1, 17))
def test_every_k(gpu_device: torch.device, k: int) -> None:
    seed = fresh_seed()
    points = knn_clouds.make("clusters", 3000, seed, gpu_device)
    check_against_reference(points, k, f"clusters N=3000 k={k} seed={seed}")


@pytest.mark.slow
@pytest.mark.parametrize("k", (3, 16))
@pytest.mark.parametrize(
    "cloud", ("uniform", "clusters", "offset", "sfm_scatter", "sfm_far", "sfm_extreme")
)
def test_matches_reference_rows_2m(gpu_device: torch.device, cloud: str, k: int) -> None:
    """2M points: the reference checks 3000 random rows against all points."""
    seed = fresh_seed()
    points = knn_clouds.make(cloud, 2_000_000, seed, gpu_device)
    got = knn_mean_sq_dist(points, k)
    rows = torch.randperm(points.shape[0], device=gpu_device)[:3000]
    want = reference(points, k, rows=rows, chunk_elements=REF_CHUNK)
    assert_matches(got[rows], want, k, f"{cloud} N=2e6 k={k} seed={seed}")
    if cloud != "sfm_extreme":
        assert torch.isfinite(got).all()


@pytest.mark.sanitizer
@pytest.mark.parametrize("cloud", ("uniform", "clusters", "sfm_scatter", "sfm_extreme"))
def test_one_query_at_a_time(
    gpu_device: torch.device, monkeypatch: pytest.MonkeyPatch, cloud: str
) -> None:
    """Walk budget 0: every query is deferred (one warp per query, own point as the query
    box); the results are the same, bit for bit."""
    seed = fresh_seed()
    points = knn_clouds.make(cloud, 5000, seed, gpu_device)
    want = knn_mean_sq_dist(points, 3)
    monkeypatch.setenv("GPUCHECK_KNN_WALK_BUDGET", "0")
    got = check_against_reference(points, 3, f"{cloud} N=5000 budget=0 seed={seed}")
    assert torch.equal(got, want)


@pytest.mark.sanitizer
def test_extreme_coordinates(gpu_device: torch.device) -> None:
    """Coordinates of +-3e38: distances overflow to +inf, except between equal points."""
    big = knn_clouds.EXTREME
    core = knn_clouds.make("uniform", 1000, fresh_seed(), gpu_device)
    corner = torch.tensor([[big, -big, big]] * 4 + [[-big, -big, -big]], device=gpu_device)
    points = torch.cat([core, corner])
    for k in (1, 3):
        got = check_against_reference(points, k, f"extreme k={k}")
        assert bool(torch.isfinite(got[:1000]).all())
        assert torch.equal(got[1000:1004], torch.zeros(4, device=gpu_device))  # 4 copies
        assert bool(torch.isposinf(got[1004]))
    # k = 4: the 4th neighbour of each copy is +inf away, so their results are +inf too.
    assert bool(torch.isposinf(check_against_reference(points, 4, "extreme k=4")[1000:]).all())


def test_bad_walk_budget(gpu_device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCHECK_KNN_WALK_BUDGET", "-3")
    with pytest.raises(ValueError, match="GPUCHECK_KNN_WALK_BUDGET must be a non-negative int"):
        knn_mean_sq_dist(torch.rand(50, 3, device=gpu_device), 3)


@pytest.mark.sanitizer
def test_duplicates_give_exact_zero(gpu_device: torch.device) -> None:
    base = knn_clouds.make("uniform", 700, fresh_seed(), gpu_device)
    points = base.repeat(4, 1)[torch.randperm(2800, device=gpu_device)].contiguous()
    assert torch.equal(knn_mean_sq_dist(points, 3), torch.zeros(2800, device=gpu_device))
    # Four copies: the 4th neighbour is a different point, so k = 4 is positive everywhere.
    assert bool((knn_mean_sq_dist(points, 4) > 0).all())


@pytest.mark.sanitizer
def test_all_points_equal(gpu_device: torch.device) -> None:
    points = torch.full((100, 3), 1.5e4, device=gpu_device)
    points += torch.rand(1, 3, device=gpu_device)  # one random point, repeated
    assert torch.equal(knn_mean_sq_dist(points, 16), torch.zeros(100, device=gpu_device))


@pytest.mark.sanitizer
def test_bitwise_repeatable(gpu_device: torch.device) -> None:
    points = knn_clouds.make("clusters", 50_000, fresh_seed(), gpu_device)
    first = knn_mean_sq_dist(points, 3)
    for _ in range(3):
        assert torch.equal(knn_mean_sq_dist(points, 3), first)


@pytest.mark.multigpu
def test_bitwise_across_devices(
    gpu_device: torch.device, other_device: torch.device | None
) -> None:
    if other_device is None:
        pytest.skip("needs a second visible CUDA device")
    points = knn_clouds.make("clusters", 100_000, fresh_seed(), gpu_device)
    here = knn_mean_sq_dist(points, 3)
    there = knn_mean_sq_dist(points.to(other_device), 3)
    assert there.device == other_device
    assert torch.equal(here, there.to(gpu_device))


@pytest.mark.sanitizer
def test_current_device_unchanged(
    gpu_device: torch.device, other_device: torch.device | None
) -> None:
    before = torch.cuda.current_device()
    if other_device is not None:
        assert before == other_device.index  # the fixture made another device current
    points = knn_clouds.make("uniform", 5000, fresh_seed(), gpu_device)
    out = knn_mean_sq_dist(points, 3)
    assert torch.cuda.current_device() == before
    assert out.device == gpu_device
    # The next default-device allocation still lands on the caller's device.
    assert torch.empty(1, device="cuda").device.index == before


@pytest.mark.sanitizer
def test_side_stream(gpu_device: torch.device) -> None:
    points = knn_clouds.make("uniform", 20_000, fresh_seed(), gpu_device)
    want = knn_mean_sq_dist(points, 3)
    stream = torch.cuda.Stream(device=gpu_device)
    stream.wait_stream(torch.cuda.current_stream(gpu_device))
    with torch.cuda.stream(stream):
        got = knn_mean_sq_dist(points, 3)
    stream.synchronize()
    assert torch.equal(got, want)


@pytest.mark.sanitizer
def test_opcheck(gpu_device: torch.device) -> None:
    from gpucheck.kernels.knn.op import op

    points = knn_clouds.make("uniform", 777, fresh_seed(), gpu_device)
    torch.library.opcheck(op(), (points, 5))


BAD_INPUTS = [
    # (id, make(device) -> (points, k), exception, message pattern)
    (
        "shape_2d",
        lambda d: (torch.rand(10, 2, device=d), 3),
        ValueError,
        r"points must be \[N, 3\], got \[10, 2\]",
    ),
    (
        "shape_1d",
        lambda d: (torch.rand(30, device=d), 3),
        ValueError,
        r"points must be \[N, 3\], got \[30\]",
    ),
    (
        "shape_3d",
        lambda d: (torch.rand(10, 3, 1, device=d), 3),
        ValueError,
        r"points must be \[N, 3\], got \[10, 3, 1\]",
    ),
    (
        "float64",
        lambda d: (torch.rand(10, 3, device=d, dtype=torch.float64), 3),
        TypeError,
        r"points must be float32, got Double",
    ),
    (
        "float16",
        lambda d: (torch.rand(10, 3, device=d).half(), 3),
        TypeError,
        r"points must be float32, got Half",
    ),
    (
        "int",
        lambda d: (torch.randint(0, 9, (10, 3), device=d), 3),
        TypeError,
        r"points must be float32, got Long",
    ),
    (
        "non_contiguous",
        lambda d: (torch.rand(3, 10, device=d).t(), 3),
        ValueError,
        r"points must be contiguous, got strides \[1, 10\]",
    ),
    (
        "cpu",
        lambda d: (torch.rand(10, 3), 3),
        ValueError,
        r"points must be a CUDA tensor, got one on cpu",
    ),
    (
        "n_equals_k",
        lambda d: (torch.rand(3, 3, device=d), 3),
        ValueError,
        r"needs more than k points .* got N = 3 with k = 3",
    ),
    (
        "n_zero",
        lambda d: (torch.rand(0, 3, device=d), 1),
        ValueError,
        r"needs more than k points .* got N = 0 with k = 1",
    ),
    (
        "k_zero",
        lambda d: (torch.rand(10, 3, device=d), 0),
        ValueError,
        r"k must be in \[1, 16\], got 0",
    ),
    (
        "k_17",
        lambda d: (torch.rand(100, 3, device=d), 17),
        ValueError,
        r"k must be in \[1, 16\], got 17",
    ),
    (
        "k_negative",
        lambda d: (torch.rand(10, 3, device=d), -2),
        ValueError,
        r"k must be in \[1, 16\], got -2",
    ),
    ("k_float", lambda d: (torch.rand(10, 3, device=d), 3.0), TypeError, r"k must be an int"),
]


def test_dtype_coverage(gpu_device: torch.device) -> None:
    """float32 works; every other floating dtype is refused with an error naming it."""
    check_dtypes(
        lambda p: knn_mean_sq_dist(p, 3),
        lambda dtype: (knn_clouds.make("uniform", 1000, fresh_seed(), gpu_device).to(dtype),),
        supported=("float32",),
        what="knn_mean_sq_dist",
    )


@pytest.mark.sanitizer
@pytest.mark.parametrize(
    ("make", "exc", "pattern"), [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input(gpu_device: torch.device, make, exc: type[Exception], pattern: str) -> None:
    points, k = make(gpu_device)
    before = torch.cuda.current_device()
    with pytest.raises(exc, match=pattern):
        knn_mean_sq_dist(points, k)
    assert torch.cuda.current_device() == before
    # The error left no broken state behind: a valid call on the same device still works.
    ok = knn_mean_sq_dist(torch.rand(50, 3, device=gpu_device) + 1, 3)
    assert bool((ok > 0).all())


# The checks of the C++ entry point itself (torch.ops callers skip the Python ones) and the
# NaN/inf check (found on the device, raised in C++). They run in a child process, poisoned
# like the fixture does it, so that a crash while raising is reported as a failure of this
# test instead of killing the suite (a segfault was seen here once on the GPU machine).
_CPP_CASES = r"""
import json, sys, torch
from gpucheck.kernels.knn.op import knn_mean_sq_dist, op
from gpucheck.worker.poison import make_other_device_current
dev = torch.device("cuda", int(sys.argv[1]))
make_other_device_current(dev)
before = torch.cuda.current_device()
def bad(row, col, value):
    p = torch.rand(100, 3, device=dev)
    p[row, col] = value
    return p
cases = {
    "shape": lambda: op()(torch.rand(10, 2, device=dev), 3),
    "dtype": lambda: op()(torch.rand(10, 3, device=dev, dtype=torch.float64), 3),
    "non_contiguous": lambda: op()(torch.rand(3, 10, device=dev).t(), 3),
    "k_range": lambda: op()(torch.rand(10, 3, device=dev), 17),
    "n_le_k": lambda: op()(torch.rand(3, 3, device=dev), 3),
    "nan": lambda: knn_mean_sq_dist(bad(57, 1, float("nan")), 3),
    "inf": lambda: knn_mean_sq_dist(bad(3, 2, -float("inf")), 3),
}
out = {}
for name, call in cases.items():
    try:
        call()
        out[name] = "no error"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"
    out[name + ".device_unchanged"] = torch.cuda.current_device() == before
ok = knn_mean_sq_dist(torch.rand(50, 3, device=dev) + 1, 3)
out["healthy_after"] = bool((ok > 0).all())
print(json.dumps(out))
"""

CPP_EXPECTED = {
    "shape": r"^ValueError: knn_mean_sq_dist: points must be \[N, 3\], got \[10, 2\]",
    "dtype": r"^TypeError: knn_mean_sq_dist: points must be float32, got Double",
    "non_contiguous": r"^ValueError: .*points must be contiguous, got strides \[1, 10\]",
    "k_range": r"^ValueError: .*k must be in \[1, 16\], got 17",
    "n_le_k": r"^ValueError: .*needs more than k points .* got N = 3 with k = 3",
    "nan": r"^ValueError: .*points must be finite, but row 57 is \(.*nan.*\)",
    "inf": r"^ValueError: .*points must be finite, but row 3 is \(.*-inf\)",
}


@pytest.mark.sanitizer
def test_cpp_checks_and_non_finite(gpu_device: torch.device) -> None:
    import re

    proc = subprocess.run(
        [sys.executable, "-c", _CPP_CASES, str(gpu_device.index)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"child process died (exit code {proc.returncode}) while raising the op's errors:\n"
        f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, pattern in CPP_EXPECTED.items():
        assert re.search(pattern, got[name]), f"{name}: {got[name]!r} !~ {pattern!r}"
        assert got[name + ".device_unchanged"], name
    assert got["healthy_after"]
