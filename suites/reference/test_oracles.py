"""The oracles on this machine: gpucheck's pure-PyTorch references (``gpucheck.reference``),
which every kernel suite judges the CUDA kernels against, checked on this machine's torch
against computations written independently of them. A CPU suite: it runs without a GPU
(``gpucheck run --cpu-only``), so a torch or numpy upgrade that changes an oracle shows here
before any kernel is blamed for it.

Inputs are fresh random draws (the seed is printed); sizes are not tile or window multiples.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from gpucheck.reference import knn_mean_sq_dist, rasterize, ssim

F64 = torch.float64


@pytest.fixture
def gen() -> torch.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")  # shown when a case fails
    return torch.Generator().manual_seed(seed)


# --- KNN: mean squared distance to the k nearest other points -----------------------------


@pytest.mark.parametrize("k", [1, 3, 16])
@pytest.mark.parametrize("n", [17, 203])
def test_knn_matches_all_pairs(gen: torch.Generator, n: int, k: int) -> None:
    """Against every pair by broadcasting, self excluded, k smallest by a full sort."""
    pts = torch.rand(n, 3, generator=gen, dtype=F64) * 4 - 2
    pts[n // 2] = pts[0]  # a duplicate: distance exactly 0
    d2 = ((pts[:, None, :] - pts[None, :, :]) ** 2).sum(-1)
    d2.fill_diagonal_(math.inf)
    want = d2.sort(dim=1).values[:, :k].mean(dim=1)
    got = knn_mean_sq_dist(pts, k)
    assert got.dtype == F64 and got.shape == (n,)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0.0)


def test_knn_float32_input_is_judged_in_float64(gen: torch.Generator) -> None:
    pts = torch.rand(97, 3, generator=gen) * 1000
    exact = pts.double()
    d2 = ((exact[:, None] - exact[None]) ** 2).sum(-1).fill_diagonal_(math.inf)
    torch.testing.assert_close(
        knn_mean_sq_dist(pts, 3), d2.sort(dim=1).values[:, :3].mean(dim=1), rtol=1e-12, atol=0.0
    )


# --- SSIM: 11x11 Gaussian window (sigma 1.5), C1 = 0.01^2, C2 = 0.03^2 ----------------------


def _window() -> list[list[float]]:
    g = [math.exp(-((i - 5) ** 2) / (2 * 1.5**2)) for i in range(11)]
    s = math.fsum(g)
    return [[a * b / (s * s) for b in g] for a in g]


def _ssim_at(x: torch.Tensor, y: torch.Tensor, row: int, col: int) -> float:
    """SSIM of one pixel of one channel, every sum written out (zero padding outside)."""
    w = _window()
    h, wd = x.shape
    sx = sy = sxx = syy = sxy = 0.0
    for i in range(11):
        for j in range(11):
            r, c = row + i - 5, col + j - 5
            if 0 <= r < h and 0 <= c < wd:
                a, b = float(x[r, c]), float(y[r, c])
                sx += w[i][j] * a
                sy += w[i][j] * b
                sxx += w[i][j] * a * a
                syy += w[i][j] * b * b
                sxy += w[i][j] * a * b
    c1, c2 = 0.01**2, 0.03**2
    vx, vy, cxy = sxx - sx * sx, syy - sy * sy, sxy - sx * sy
    return ((2 * sx * sy + c1) * (2 * cxy + c2)) / ((sx * sx + sy * sy + c1) * (vx + vy + c2))


def test_ssim_map_matches_windows_written_out(gen: torch.Generator) -> None:
    img1 = torch.rand(2, 3, 23, 19, generator=gen, dtype=F64)
    img2 = (img1 + 0.2 * torch.randn(img1.shape, generator=gen, dtype=F64)).clamp(0, 1)
    got = ssim(img1, img2, padding="same", reduction="none")
    assert got.shape == img1.shape
    picks = [
        (b, c, int(r), int(q))
        for b, c in ((0, 0), (1, 2), (0, 1))
        for r, q in zip(
            torch.randint(0, 23, (4,), generator=gen),
            torch.randint(0, 19, (4,), generator=gen),
            strict=True,
        )
    ]
    picks += [(0, 0, 0, 0), (1, 1, 22, 18)]  # corners: most of the window is padding
    for b, c, r, q in picks:
        want = _ssim_at(img1[b, c], img2[b, c], r, q)
        assert math.isclose(float(got[b, c, r, q]), want, rel_tol=1e-10, abs_tol=1e-12), (
            f"SSIM map at {(b, c, r, q)}: {float(got[b, c, r, q])!r} != {want!r}"
        )


def test_ssim_of_an_image_with_itself_is_one_and_symmetric(gen: torch.Generator) -> None:
    a = torch.rand(1, 3, 31, 17, generator=gen, dtype=F64)
    b = torch.rand(1, 3, 31, 17, generator=gen, dtype=F64)
    torch.testing.assert_close(ssim(a, a), torch.tensor(1.0, dtype=F64), rtol=0, atol=1e-12)
    torch.testing.assert_close(ssim(a, b), ssim(b, a), rtol=1e-14, atol=0)
    assert float(ssim(a, b)) < 0.5  # independent noise images are far from identical


def test_ssim_gradient_matches_finite_differences(gen: torch.Generator) -> None:
    a = torch.rand(1, 2, 13, 12, generator=gen, dtype=F64, requires_grad=True)
    b = torch.rand(1, 2, 13, 12, generator=gen, dtype=F64)
    assert torch.autograd.gradcheck(lambda x: ssim(x, b), (a,), eps=1e-6, atol=1e-8)


# --- Splatting: properties any correct rasterizer has, whatever its conventions -------------


def _scene(gen: torch.Generator, n: int) -> dict[str, torch.Tensor]:
    means = torch.randn(n, 3, generator=gen, dtype=F64) * torch.tensor([0.6, 0.4, 0.3], dtype=F64)
    means[:, 2] += 3.0 + torch.arange(n, dtype=F64) * 1e-3  # distinct depths
    return {
        "means": means,
        "scales": torch.rand(n, 3, generator=gen, dtype=F64) * 0.15 + 0.03,
        "rotations": torch.randn(n, 4, generator=gen, dtype=F64),
        "opacities": torch.rand(n, generator=gen, dtype=F64) * 0.8 + 0.1,
        "colors": torch.rand(n, 3, generator=gen, dtype=F64),
    }


def _render(scene: dict[str, torch.Tensor], viewmat: torch.Tensor) -> torch.Tensor:
    K = torch.tensor([[40.0, 0, 23.5], [0, 40.0, 15.5], [0, 0, 1]], dtype=F64)
    return rasterize(
        **scene,
        viewmat=viewmat,
        K=K,
        width=47,
        height=31,
        background=torch.tensor([0.1, 0.2, 0.3], dtype=F64),
    ).image


def _quat_mul(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    w1, x1, y1, z1 = p.unbind(-1)
    w2, x2, y2, z2 = q.unbind(-1)
    return torch.stack(
        [
            w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
            w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
            w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
            w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
        ],
        -1,
    )


def _rotation_of(q: torch.Tensor) -> torch.Tensor:
    """The matrix of unit quaternion q (wxyz), from rotating each axis as q v q*."""
    conj = q * torch.tensor([1.0, -1, -1, -1], dtype=F64)
    cols = [
        _quat_mul(_quat_mul(q, torch.cat([torch.zeros(1, dtype=F64), e])), conj)[1:]
        for e in torch.eye(3, dtype=F64)
    ]
    return torch.stack(cols, dim=1)


def test_splat_image_is_the_same_after_moving_world_and_camera_together(
    gen: torch.Generator,
) -> None:
    """Move every Gaussian by a rigid motion (centres and orientations) and the camera by the
    same motion: the image must not change."""
    scene = _scene(gen, 40)
    before = _render(scene, torch.eye(4, dtype=F64))
    q = torch.randn(4, generator=gen, dtype=F64)
    q = q / q.norm()
    rot, shift = _rotation_of(q), torch.randn(3, generator=gen, dtype=F64)
    moved = dict(
        scene,
        means=scene["means"] @ rot.T + shift,
        rotations=_quat_mul(q.expand_as(scene["rotations"]), scene["rotations"]),
    )
    view = torch.eye(4, dtype=F64)  # world -> camera undoes the motion
    view[:3, :3] = rot.T
    view[:3, 3] = -rot.T @ shift
    torch.testing.assert_close(_render(moved, view), before, rtol=1e-9, atol=1e-10)


def test_splat_order_of_the_gaussians_does_not_matter(gen: torch.Generator) -> None:
    scene = _scene(gen, 30)
    perm = torch.randperm(30, generator=gen)
    shuffled = {k: v[perm] for k, v in scene.items()}
    view = torch.eye(4, dtype=F64)
    torch.testing.assert_close(
        _render(shuffled, view), _render(scene, view), rtol=1e-12, atol=1e-12
    )


def test_splat_nothing_in_view_is_background(gen: torch.Generator) -> None:
    scene = _scene(gen, 10)
    scene["means"][:, 2] = -3.0  # all behind the camera
    image = _render(scene, torch.eye(4, dtype=F64))
    want = torch.tensor([0.1, 0.2, 0.3], dtype=F64)[:, None, None].expand_as(image)
    torch.testing.assert_close(image, want, rtol=0, atol=0)
