"""CPU tests of the KNN oracle (gpucheck.reference.knn_mean_sq_dist) against an independent
plain-Python brute force, plus its edge cases and input errors."""

from __future__ import annotations

import math
import os
import random

import pytest
import torch

from gpucheck.kernels.knn.reference import knn_mean_sq_dist as direct
from gpucheck.reference import knn_mean_sq_dist


def brute_force(points: list[tuple[float, float, float]], k: int) -> list[float]:
    """Independent oracle: every pair, Python floats (double), sorted, mean of the k smallest."""
    out = []
    for i, p in enumerate(points):
        d = sorted(
            math.fsum((a - b) ** 2 for a, b in zip(p, q, strict=True))
            for j, q in enumerate(points)
            if j != i
        )
        out.append(math.fsum(d[:k]) / k)
    return out


def random_points(
    n: int, rng: random.Random, scale: float = 1.0, shift: float = 0.0
) -> list[tuple[float, float, float]]:
    return [tuple(shift + scale * rng.random() for _ in range(3)) for _ in range(n)]  # type: ignore[misc]


def as_tensor(points: list[tuple[float, float, float]], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(points, dtype=torch.float64).to(dtype)


@pytest.fixture
def rng() -> random.Random:
    return random.Random(int.from_bytes(os.urandom(8), "little"))  # fresh data every run


def test_lazy_export_is_the_module_function() -> None:
    assert knn_mean_sq_dist is direct


@pytest.mark.parametrize("k", [1, 2, 3, 7, 16])
@pytest.mark.parametrize("n", [17, 40, 97])
def test_matches_python_brute_force(rng: random.Random, n: int, k: int) -> None:
    pts = random_points(n, rng)
    got = knn_mean_sq_dist(as_tensor(pts, torch.float64), k)
    assert got.dtype == torch.float64 and got.shape == (n,)
    want = torch.tensor(brute_force(pts, k), dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=0.0)


def test_float32_input_is_upcast_exactly(rng: random.Random) -> None:
    pts32 = as_tensor(random_points(60, rng, scale=3.0, shift=-1.0), torch.float32)
    exact = [tuple(float(c) for c in row) for row in pts32.tolist()]
    torch.testing.assert_close(
        knn_mean_sq_dist(pts32, 3),
        torch.tensor(brute_force(exact, 3), dtype=torch.float64),
        rtol=1e-13,
        atol=0.0,
    )


def test_k_equals_n_minus_1_is_mean_over_all_others(rng: random.Random) -> None:
    pts = random_points(12, rng)
    got = knn_mean_sq_dist(as_tensor(pts, torch.float64), 11)
    want = [
        math.fsum(
            sum((a - b) ** 2 for a, b in zip(p, q, strict=True))
            for j, q in enumerate(pts)
            if j != i
        )
        / 11
        for i, p in enumerate(pts)
    ]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-13, atol=0)


def test_two_points() -> None:
    pts = torch.tensor([[0.5, -1.0, 2.0], [1.5, 1.0, 0.0]], dtype=torch.float32)
    assert knn_mean_sq_dist(pts, 1).tolist() == [9.0, 9.0]


def test_duplicates_give_zero(rng: random.Random) -> None:
    base = random_points(30, rng)
    pts = as_tensor(base * 3, torch.float32)  # every point three times
    assert torch.equal(knn_mean_sq_dist(pts, 2), torch.zeros(90, dtype=torch.float64))
    third = knn_mean_sq_dist(pts, 3)  # the third neighbour is another point
    assert bool((third > 0).all())
    exact = [tuple(float(c) for c in row) for row in pts.tolist()]
    torch.testing.assert_close(
        third, torch.tensor(brute_force(exact, 3), dtype=torch.float64), rtol=1e-13, atol=0.0
    )


def test_large_offset_keeps_precision(rng: random.Random) -> None:
    """1e4 + noise: a |a|^2 + |b|^2 - 2ab formula would lose ~1e-2 relative here."""
    small = random_points(200, rng, scale=0.01)
    shifted = torch.tensor(small, dtype=torch.float64) + 1e4
    near = knn_mean_sq_dist(torch.tensor(small, dtype=torch.float64), 3)
    torch.testing.assert_close(knn_mean_sq_dist(shifted, 3), near, rtol=1e-6, atol=0.0)


def test_offset_float32_against_brute_force(rng: random.Random) -> None:
    pts = as_tensor(random_points(80, rng, scale=1.0, shift=1e4), torch.float32)
    exact = [tuple(float(c) for c in row) for row in pts.tolist()]
    torch.testing.assert_close(
        knn_mean_sq_dist(pts, 4),
        torch.tensor(brute_force(exact, 4), dtype=torch.float64),
        rtol=1e-13,
        atol=0.0,
    )


def test_planar_and_collinear(rng: random.Random) -> None:
    plane = [(rng.random(), rng.random(), 0.25) for _ in range(50)]
    line = [(rng.random(), -1.0, 3.0) for _ in range(50)]
    for pts in (plane, line):
        torch.testing.assert_close(
            knn_mean_sq_dist(as_tensor(pts, torch.float64), 3),
            torch.tensor(brute_force(pts, 3), dtype=torch.float64),
            rtol=1e-13,
            atol=0.0,
        )


def test_rows_and_chunking_agree_with_full(rng: random.Random) -> None:
    pts = as_tensor(random_points(300, rng), torch.float32)
    full = knn_mean_sq_dist(pts, 5)
    rows = torch.tensor([299, 0, 17, 17, 150])
    assert torch.equal(knn_mean_sq_dist(pts, 5, rows=rows), full[rows])
    # Chunks of one row, then of 7 rows (not dividing 300), give the same values.
    assert torch.equal(knn_mean_sq_dist(pts, 5, chunk_elements=1), full)
    assert torch.equal(knn_mean_sq_dist(pts, 5, chunk_elements=7 * 300), full)


def test_k_above_16_allowed_in_reference(rng: random.Random) -> None:
    pts = random_points(30, rng)
    torch.testing.assert_close(
        knn_mean_sq_dist(as_tensor(pts, torch.float64), 20),
        torch.tensor(brute_force(pts, 20), dtype=torch.float64),
        rtol=1e-13,
        atol=0.0,
    )


@pytest.mark.parametrize(
    ("points", "k", "exc", "pattern"),
    [
        (torch.rand(10, 2), 3, ValueError, r"points must be \[N, 3\], got \[10, 2\]"),
        (torch.rand(30), 3, ValueError, r"points must be \[N, 3\], got \[30\]"),
        (torch.randint(0, 5, (10, 3)), 3, TypeError, r"must be floating point, got torch.int64"),
        (torch.rand(3, 3), 3, ValueError, r"got N = 3 with k = 3"),
        (torch.rand(0, 3), 1, ValueError, r"got N = 0 with k = 1"),
        (torch.rand(10, 3), 0, ValueError, r"k must be >= 1, got 0"),
        (torch.rand(10, 3), 2.0, TypeError, r"k must be an int"),
        (torch.rand(10, 3), True, TypeError, r"k must be an int"),
        ([[0.0, 0.0, 0.0]] * 5, 1, TypeError, r"points must be a torch.Tensor"),
    ],
    ids=["shape2", "shape1d", "int", "n_eq_k", "empty", "k0", "kfloat", "kbool", "list"],
)
def test_bad_input(points: torch.Tensor, k: int, exc: type[Exception], pattern: str) -> None:
    with pytest.raises(exc, match=pattern):
        knn_mean_sq_dist(points, k)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_names_the_row(value: float) -> None:
    pts = torch.rand(20, 3)
    pts[13, 0] = value
    with pytest.raises(ValueError, match=r"points must be finite, but row 13 is"):
        knn_mean_sq_dist(pts, 3)
