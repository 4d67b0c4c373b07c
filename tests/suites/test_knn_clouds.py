"""CPU tests of the KNN suite's point clouds (suites/knn/knn_clouds.py): shapes, the outlier
counts and distances the ``sfm_*`` clouds promise, and the float32 overflow rule."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

from gpucheck import _resources
from gpucheck.reference import knn_mean_sq_dist as reference

_PATH = _resources.suites() / "knn" / "knn_clouds.py"  # the installed suite's
_SPEC = importlib.util.spec_from_file_location("knn_clouds", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
knn_clouds = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("knn_clouds", knn_clouds)
_SPEC.loader.exec_module(knn_clouds)


@pytest.fixture
def seed() -> int:
    return int.from_bytes(os.urandom(4), "little")  # fresh data every run


def far_rows(points: torch.Tensor, radius: float = 50.0) -> torch.Tensor:
    """Rows farther than ``radius`` from the origin (the core has sigma <= 1: 50 sigma)."""
    return points.double().abs().amax(dim=1) > radius


@pytest.mark.parametrize("name", list(knn_clouds.CLOUDS))
@pytest.mark.parametrize("n", [2, 33, 1000, 20_000])
def test_shape_dtype_finite(name: str, n: int, seed: int) -> None:
    p = knn_clouds.make(name, n, seed, "cpu")
    assert p.shape == (n, 3) and p.dtype == torch.float32 and p.is_contiguous()
    assert bool(torch.isfinite(p).all())


@pytest.mark.parametrize(
    ("name", "fraction", "cap", "low", "high"),
    [
        ("sfm_scatter", 1e-3, None, 50.0, 1e4),
        ("sfm_far", 1e-3, 10, 0.99e7, 1.01e7),
        ("sfm_sparse", 1e-4, None, 1e2 / 3**0.5, 1e6),
        ("sfm_heavy", 1e-2, None, 10.0 / 3**0.5, 1e5),
    ],
)
@pytest.mark.parametrize("n", [2, 1000, 200_000])
def test_sfm_outlier_counts_and_distances(
    name: str, fraction: float, cap: int | None, low: float, high: float, n: int, seed: int
) -> None:
    p = knn_clouds.make(name, n, seed, "cpu")
    m = knn_clouds.outlier_count(n, fraction, cap)
    assert m == min(n - 1, max(1, min(round(fraction * n), cap or n)))
    radius = min(low, 50.0)  # the core's points are all inside 50 sigma
    far = far_rows(p, radius)
    # sfm_heavy's nearest outliers (distance 10) can fall inside 50: count them by the norm.
    dist = p.double().norm(dim=1)
    outliers = dist >= low * (1 - 1e-6) if name != "sfm_scatter" else far
    assert int(outliers.sum()) == m, f"{name}: {int(outliers.sum())} outliers, expected {m}"
    assert bool((p[outliers].double().abs().amax(dim=1) <= high * (1 + 1e-6)).all())
    core = p[~outliers].double()
    if core.shape[0] > 1000:
        sigma = core.std(dim=0)
        want = torch.tensor(knn_clouds.CORE_SIGMA, dtype=torch.float64)
        torch.testing.assert_close(sigma, want, rtol=0.05, atol=0.0)
    # Random row order: the outliers are not all at the end.
    if m >= 20:
        idx = outliers.nonzero().squeeze(1).double()
        assert float(idx.mean()) < 0.9 * n


@pytest.mark.parametrize("n", [2, 1000, 200_000])
def test_sfm_extreme(n: int, seed: int) -> None:
    p = knn_clouds.make("sfm_extreme", n, seed, "cpu").double()
    m_ext = knn_clouds.outlier_count(n, 1e-3, cap=4)
    extreme = p.abs().amin(dim=1) == float(torch.tensor(knn_clouds.EXTREME).float())
    assert int(extreme.sum()) == m_ext
    scatter = far_rows(p) & ~extreme
    assert int(scatter.sum()) == min(knn_clouds.outlier_count(n, 1e-3), n - m_ext)


def test_overflow_rows_follow_the_float32_sum() -> None:
    f32max = knn_clouds.F32_MAX
    want = torch.tensor(
        [1.0, f32max / 3 * 0.999, f32max / 3 * 1.001, f32max / 3, 1e77], dtype=torch.float64
    )
    over, edge = knn_clouds.overflow_rows(want, 3)
    assert over.tolist() == [False, False, True, False, True]
    assert edge.tolist() == [False, False, False, True, False]


def test_extreme_corner_overflows_in_the_reference() -> None:
    """Two points 6e38 apart: the float64 reference is finite, the float32 rule says +inf."""
    p = torch.tensor([[3e38, 0.0, 0.0], [-3e38, 0.0, 0.0]])
    want = reference(p, 1)
    over, _ = knn_clouds.overflow_rows(want, 1)
    assert bool(torch.isfinite(want).all()) and bool(over.all())
