"""CPU tests of gpucheck.reference.ssim against an SSIM written independently here.

The independent version walks every output pixel, cuts its 11×11 neighbourhood out of the
zero-padded images and forms the weighted statistics explicitly (no convolution), with a
window built here from the Gaussian formula. rounding_sensitivity: its partial derivatives
against autograd, its estimates against the errors of torch's float32 SSIM.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gpucheck.kernels.ssim.reference import (
    C1,
    C2,
    Moments,
    _partials,
    rounding_sensitivity,
    ssim,
)


def _window() -> torch.Tensor:
    g = [math.exp(-((i - 5) ** 2) / (2 * 1.5**2)) for i in range(11)]
    total = sum(g)
    g1 = torch.tensor([v / total for v in g], dtype=torch.float64)
    return g1[:, None] * g1[None, :]


def _ssim_loops(x: torch.Tensor, y: torch.Tensor, padding: str) -> torch.Tensor:
    """SSIM map by explicit windows; x, y: [B, C, H, W] float64."""
    c1, c2 = 0.01**2, 0.03**2
    w = _window()
    b, c, h, wd = x.shape
    xp = torch.zeros(b, c, h + 10, wd + 10, dtype=torch.float64)
    yp = torch.zeros_like(xp)
    xp[..., 5:-5, 5:-5] = x
    yp[..., 5:-5, 5:-5] = y
    rows = range(5, h - 5) if padding == "valid" else range(h)
    cols = range(5, wd - 5) if padding == "valid" else range(wd)
    out = torch.empty(b, c, len(rows), len(cols), dtype=torch.float64)
    for n in range(b):
        for ch in range(c):
            for oi, i in enumerate(rows):
                for oj, j in enumerate(cols):
                    px = xp[n, ch, i : i + 11, j : j + 11]
                    py = yp[n, ch, i : i + 11, j : j + 11]
                    mx = float((w * px).sum())
                    my = float((w * py).sum())
                    vx = float((w * (px - mx) ** 2).sum())
                    vy = float((w * (py - my) ** 2).sum())
                    cxy = float((w * (px - mx) * (py - my)).sum())
                    # sum(w) == 1, so E_w[(p - m)^2] equals E_w[p^2] - m^2 exactly in reals
                    out[n, ch, oi, oj] = ((2 * mx * my + c1) * (2 * cxy + c2)) / (
                        (mx * mx + my * my + c1) * (vx + vy + c2)
                    )
    return out


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("shape", [(1, 1, 13, 12), (2, 3, 14, 17)])
def test_map_matches_explicit_windows(
    gen: torch.Generator, padding: str, shape: tuple[int, ...]
) -> None:
    x = torch.rand(shape, generator=gen, dtype=torch.float64)
    y = (x + 0.2 * torch.rand(shape, generator=gen, dtype=torch.float64)).clamp(0, 1)
    got = ssim(x, y, padding=padding, reduction="none")
    want = _ssim_loops(x, y, padding)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ssim(x, y, padding=padding), want.mean(), rtol=1e-10, atol=1e-12)


def test_small_images_same_padding(gen: torch.Generator) -> None:
    # Smaller than the window: every pixel's window is clipped by the zero padding.
    for shape in [(1, 1, 1, 1), (1, 2, 3, 5)]:
        x = torch.rand(shape, generator=gen, dtype=torch.float64)
        y = torch.rand(shape, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(
            ssim(x, y, reduction="none"), _ssim_loops(x, y, "same"), rtol=1e-10, atol=1e-12
        )


def test_constant_images_have_the_luminance_term_only() -> None:
    # In the interior of constant images the variances vanish: SSIM = (2ab+C1)/(a²+b²+C1).
    a, b = 0.3, 0.7
    x = torch.full((1, 1, 15, 15), a, dtype=torch.float64)
    y = torch.full((1, 1, 15, 15), b, dtype=torch.float64)
    got = ssim(x, y, padding="valid", reduction="none")
    want = (2 * a * b + 1e-4) / (a * a + b * b + 1e-4)
    torch.testing.assert_close(got, torch.full_like(got, want), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_identity_symmetry_and_less_than_one(gen: torch.Generator, padding: str) -> None:
    x = torch.rand(2, 3, 16, 19, generator=gen, dtype=torch.float64)
    y = torch.rand(2, 3, 16, 19, generator=gen, dtype=torch.float64)
    same = ssim(x, x, padding=padding, reduction="none")
    torch.testing.assert_close(same, torch.ones_like(same), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        ssim(x, y, padding=padding), ssim(y, x, padding=padding), rtol=0, atol=1e-15
    )
    assert float(ssim(x, y, padding=padding)) < 0.5  # independent noise is dissimilar


def test_valid_is_the_centre_of_same(gen: torch.Generator) -> None:
    x = torch.rand(1, 2, 20, 23, generator=gen, dtype=torch.float64)
    y = torch.rand(1, 2, 20, 23, generator=gen, dtype=torch.float64)
    full = ssim(x, y, reduction="none")
    valid = ssim(x, y, padding="valid", reduction="none")
    assert valid.shape == (1, 2, 10, 13)
    torch.testing.assert_close(valid, full[..., 5:-5, 5:-5], rtol=0, atol=0)


def test_float32_close_to_float64(gen: torch.Generator) -> None:
    x = torch.rand(2, 3, 24, 31, generator=gen, dtype=torch.float64)
    y = torch.rand(2, 3, 24, 31, generator=gen, dtype=torch.float64)
    got = ssim(x.float(), y.float(), reduction="none")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ssim(x, y, reduction="none"), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_gradcheck(gen: torch.Generator, padding: str) -> None:
    x = torch.rand(1, 2, 12, 13, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.rand(1, 2, 12, 13, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ssim(a, b, padding=padding), (x, y))
    assert torch.autograd.gradcheck(
        lambda a, b: ssim(a, b, padding=padding, reduction="none"), (x, y)
    )


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "match"),
    [
        ((torch.rand(3, 4), torch.rand(3, 4)), {}, ValueError, r"got shape \[3, 4\]"),
        ((torch.rand(1, 1, 4, 4), torch.rand(1, 1, 4, 5)), {}, ValueError, "same shape"),
        ((torch.ones(1, 1, 4, 4, dtype=torch.int32),) * 2, {}, TypeError, "torch.int32"),
        ((torch.rand(1, 1, 4, 4), torch.rand(1, 1, 4, 4).double()), {}, TypeError, "same dtype"),
        ((torch.rand(0, 1, 4, 4), torch.rand(0, 1, 4, 4)), {}, ValueError, "empty"),
        ((torch.rand(1, 1, 8, 20),) * 2, {"padding": "valid"}, ValueError, "H, W >= 11"),
        ((torch.rand(1, 1, 8, 8),) * 2, {"padding": "reflect"}, ValueError, "'reflect'"),
        ((torch.rand(1, 1, 8, 8),) * 2, {"reduction": "sum"}, ValueError, "'sum'"),
    ],
)
def test_bad_arguments_are_rejected_with_the_value(
    args: tuple[torch.Tensor, ...], kwargs: dict[str, str], exc: type, match: str
) -> None:
    with pytest.raises(exc, match=match):
        ssim(*args, **kwargs)


def test_partials_match_autograd(gen: torch.Generator) -> None:
    # SSIM written here on the variables (mu1, mu2, variance sum, covariance), differentiated
    # by autograd; the moments given to _partials are built from the same variables.
    mu1, mu2 = (torch.rand(50, generator=gen, dtype=torch.float64) for _ in range(2))
    var = 0.1 * torch.rand(50, generator=gen, dtype=torch.float64)
    cov = (torch.rand(50, generator=gen, dtype=torch.float64) - 0.5) * var
    leaves = [t.clone().requires_grad_(True) for t in (mu1, mu2, var, cov)]
    a, b, v, c = leaves
    s = ((2 * a * b + C1) * (2 * c + C2)) / ((a * a + b * b + C1) * (v + C2))
    want = torch.autograd.grad(s.sum(), leaves)
    got = _partials(Moments(mu1, mu2, var + mu1 * mu1 + mu2 * mu2, cov + mu1 * mu2))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def _smooth_pair(
    gen: torch.Generator, shape: tuple[int, ...], level: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A blurred noise field around ``level`` and a copy with 0.002 of noise (float64)."""
    x = torch.rand(shape, generator=gen, dtype=torch.float64)
    box = torch.full((shape[1], 1, 9, 9), 1 / 81, dtype=torch.float64)
    for _ in range(2):
        x = F.conv2d(x, box, padding=4, groups=shape[1])
    x = (x - 0.5 + level).clamp(0, 1)
    y = (x + 0.002 * (torch.rand(shape, generator=gen, dtype=torch.float64) - 0.5)).clamp(0, 1)
    return x, y


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("images", ["noise", "smooth"])
def test_rounding_sensitivity_bounds_float32_error(
    gen: torch.Generator, padding: str, images: str
) -> None:
    """torch's float32 SSIM (CPU convolutions, the same E[x²] - mu² form) errs by at most a
    small multiple of u times the estimates, on noise and on smooth images, where it errs by
    far more than on noise: the estimates follow the error, they are not a constant."""
    shape = (2, 3, 40, 48)
    if images == "noise":
        x = torch.rand(shape, generator=gen, dtype=torch.float64)
        y = (0.7 * x + 0.3 * torch.rand(shape, generator=gen, dtype=torch.float64)).clamp(0, 1)
    else:
        x, y = _smooth_pair(gen, shape, level=0.9)
    x, y = x.float().double(), y.float().double()  # the float32 images, exactly
    u = 2.0**-24
    a = x.float().requires_grad_(True)
    a64 = x.clone().requires_grad_(True)
    got = ssim(a, y.float(), padding=padding, reduction="none")
    want = ssim(a64, y, padding=padding, reduction="none")
    weights = torch.rand(want.shape, generator=gen, dtype=torch.float64) + 0.5
    (got * weights.float()).sum().backward()
    (want * weights).sum().backward()
    assert a.grad is not None and a64.grad is not None
    sens = rounding_sensitivity(x, y, padding, weights)
    assert sens.grad1 is not None and sens.grad2 is not None
    assert sens.map.shape == want.shape and sens.grad1.shape == x.shape
    map_err = (got.detach().double() - want.detach()).abs()
    assert float((map_err / (u * sens.map)).max()) <= 32
    grad_err = float((a.grad.double() - a64.grad).norm())
    assert grad_err <= 16 * u * float(sens.grad1.norm())
    if images == "smooth":  # where the variances cancel: errors far above noise's
        assert float(map_err.max()) > 2e-4
        assert grad_err > 1e-4 * float(a64.grad.norm())
    else:
        assert float(map_err.max()) < 2e-5
        assert grad_err < 1e-5 * float(a64.grad.norm())
