"""Point clouds for the KNN suite and benchmark: fresh random data of the shapes 3DGS meets.

Every generator returns ``[N, 3]`` float32 on ``device`` from a ``torch.Generator`` seeded by
the caller (the suite draws a fresh seed per test and prints it on failure).

The ``sfm_*`` clouds are what structure-from-motion gives 3DGS: a dense Gaussian core (sigma
1, 0.6, 0.3 on x, y, z) and a few far outliers, in random row order. Their outlier counts are
:func:`outlier_count` of N (at least one point, so that every size has outliers).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

Cloud = Callable[[int, torch.Generator, torch.device], torch.Tensor]


def _rand(shape: tuple[int, ...], gen: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.rand(shape, generator=gen, device=device, dtype=torch.float64)


def uniform(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Uniform in the box [-5, 5)^3."""
    return (_rand((n, 3), gen, device) * 10 - 5).float()


def clusters(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Gaussian clusters of very different sizes and weights in [-1, 1]^3.

    About n / 500 clusters (at least 1); sigma log-uniform in [1e-4, 3e-2]; weights
    log-uniform over two decades, so dense and sparse clusters sit next to each other.
    """
    c = max(1, n // 500)
    centres = _rand((c, 3), gen, device) * 2 - 1
    sigma = torch.exp(
        torch.log(torch.tensor(1e-4))
        + _rand((c,), gen, device) * (torch.log(torch.tensor(3e-2)) - torch.log(torch.tensor(1e-4)))
    )
    weights = torch.exp(_rand((c,), gen, device) * 4.6)
    which = torch.multinomial(weights, n, replacement=True, generator=gen)
    noise = torch.randn((n, 3), generator=gen, device=device, dtype=torch.float64)
    return (centres[which] + sigma[which, None] * noise).float()


def planar(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """On the plane z = 0.25 exactly (a zero extent axis), uniform in x and y."""
    p = _rand((n, 3), gen, device) * 4 - 2
    p[:, 2] = 0.25
    return p.float()


def line(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Collinear: on the line y = -1, z = 3 (two zero-extent axes), x uniform in [0, 1)."""
    p = torch.empty((n, 3), device=device, dtype=torch.float64)
    p[:, 0] = _rand((n,), gen, device)
    p[:, 1] = -1.0
    p[:, 2] = 3.0
    return p.float()


def duplicates(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Duplicate-heavy: n draws with replacement from about n / 4 distinct uniform points."""
    base = uniform(max(1, n // 4), gen, device)
    pick = torch.randint(0, base.shape[0], (n,), generator=gen, device=device)
    return base[pick].contiguous()


def offset(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Far from the origin: 1e4 + uniform noise in [0, 1)^3 (float32 spacing there: ~1e-3)."""
    return (1e4 + _rand((n, 3), gen, device)).float()


#: Core sigma per axis of the ``sfm_*`` clouds.
CORE_SIGMA = (1.0, 0.6, 0.3)
#: Coordinate magnitude of the ``sfm_extreme`` cloud's corner points (float32 max: ~3.4e38).
EXTREME = 3e38


def outlier_count(n: int, fraction: float, cap: int | None = None) -> int:
    """Outliers in an ``sfm_*`` cloud of ``n`` points: ``round(fraction n)``, at least 1, at most
    ``cap`` and at most ``n - 1``."""
    m = max(1, round(fraction * n))
    if cap is not None:
        m = min(m, cap)
    return min(m, n - 1)


def _core(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    sigma = torch.tensor(CORE_SIGMA, dtype=torch.float64, device=device)
    return torch.randn((n, 3), generator=gen, device=device, dtype=torch.float64) * sigma


def _directions(m: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    d = torch.randn((m, 3), generator=gen, device=device, dtype=torch.float64)
    return d / d.norm(dim=1, keepdim=True).clamp_min(1e-300)


def _log_uniform(
    m: int, lo: float, hi: float, gen: torch.Generator, device: torch.device
) -> torch.Tensor:
    t = _rand((m, 1), gen, device)
    return torch.exp(math.log(lo) + t * (math.log(hi) - math.log(lo)))


def _shuffled(core: torch.Tensor, *far: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    p = torch.cat([core, *far])
    return p[torch.randperm(p.shape[0], generator=gen, device=p.device)].float().contiguous()


def sfm_scatter(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Gaussian core plus 0.1 % of the points uniform in the cube [-1e4, 1e4]^3."""
    m = outlier_count(n, 1e-3)
    far = _rand((m, 3), gen, device) * 2e4 - 1e4
    return _shuffled(_core(n - m, gen, device), far, gen=gen)


def sfm_far(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Gaussian core plus N / 1000 points (at most 10) at distance 1e7 in random directions."""
    m = outlier_count(n, 1e-3, cap=10)
    far = _directions(m, gen, device) * 1e7
    return _shuffled(_core(n - m, gen, device), far, gen=gen)


def sfm_sparse(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Gaussian core plus 0.01 % outliers at distances log-uniform in [1e2, 1e6]."""
    m = outlier_count(n, 1e-4)
    far = _directions(m, gen, device) * _log_uniform(m, 1e2, 1e6, gen, device)
    return _shuffled(_core(n - m, gen, device), far, gen=gen)


def sfm_heavy(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Gaussian core plus 1 % outliers at distances log-uniform in [10, 1e5]."""
    m = outlier_count(n, 1e-2)
    far = _directions(m, gen, device) * _log_uniform(m, 10.0, 1e5, gen, device)
    return _shuffled(_core(n - m, gen, device), far, gen=gen)


def sfm_extreme(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """``sfm_scatter`` plus N / 1000 points (at most 4) with every coordinate +-3e38.

    Their squared distances to anything overflow float32: the op gives them +inf.
    """
    m_ext = outlier_count(n, 1e-3, cap=4)
    m = min(outlier_count(n, 1e-3), n - m_ext)
    far = _rand((m, 3), gen, device) * 2e4 - 1e4
    signs = torch.randint(0, 2, (m_ext, 3), generator=gen, device=device).double() * 2 - 1
    return _shuffled(_core(n - m - m_ext, gen, device), far, signs * EXTREME, gen=gen)


CLOUDS: dict[str, Cloud] = {
    "uniform": uniform,
    "clusters": clusters,
    "planar": planar,
    "line": line,
    "duplicates": duplicates,
    "offset": offset,
    "sfm_scatter": sfm_scatter,
    "sfm_far": sfm_far,
    "sfm_sparse": sfm_sparse,
    "sfm_heavy": sfm_heavy,
    "sfm_extreme": sfm_extreme,
}
#: The structure-from-motion-like clouds (a dense core and far outliers).
SFM_CLOUDS = tuple(name for name in CLOUDS if name.startswith("sfm_"))

#: Largest float32.
F32_MAX = torch.finfo(torch.float32).max


def overflow_rows(
    want: torch.Tensor, k: int, margin: float = 1e-5
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows whose float32 result must be +inf, and rows too close to that edge to judge.

    The op sums the k smallest squared distances in float32 and divides by k, so its result is
    +inf exactly when that sum leaves the float32 range (a coordinate difference or a squared
    distance that overflows is +inf itself). ``want`` is the float64 reference mean.

    Returns:
        ``(over, edge)``, boolean like ``want``: ``k want`` above ``F32_MAX`` by more than
        ``margin`` (relative), and within ``margin`` of it.
    """
    total = want * k
    over = total > F32_MAX * (1 + margin)
    edge = (total >= F32_MAX * (1 - margin)) & ~over
    return over, edge


def make(name: str, n: int, seed: int, device: torch.device | str) -> torch.Tensor:
    """Cloud ``name`` with ``n`` points drawn from ``seed`` on ``device``."""
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return CLOUDS[name](n, gen, device)
