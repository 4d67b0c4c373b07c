"""Point clouds for the KNN suite and benchmark: fresh random data of the shapes 3DGS meets.

Every generator returns ``[N, 3]`` float32 on ``device`` from a ``torch.Generator`` seeded by
the caller (the suite draws a fresh seed per test and prints it on failure).
"""

from __future__ import annotations

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
    sigma = torch.exp(torch.log(torch.tensor(1e-4)) + _rand((c,), gen, device)
                      * (torch.log(torch.tensor(3e-2)) - torch.log(torch.tensor(1e-4))))
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


CLOUDS: dict[str, Cloud] = {
    "uniform": uniform,
    "clusters": clusters,
    "planar": planar,
    "line": line,
    "duplicates": duplicates,
    "offset": offset,
}


def make(name: str, n: int, seed: int, device: torch.device | str) -> torch.Tensor:
    """Cloud ``name`` with ``n`` points drawn from ``seed`` on ``device``."""
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return CLOUDS[name](n, gen, device)
