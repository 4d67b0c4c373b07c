"""CPU tests of the dense splatting oracle (gpucheck.reference.rasterize) against independent
computations: closed-form single Gaussians, a numerical projection Jacobian, SH quadrature, a
sequential per-pixel compositor written like a kernel's inner loop, and fp64 gradcheck."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from gpucheck.errors import BudgetExceeded
from gpucheck.kernels.splat import reference as splat
from gpucheck.kernels.splat.reference_sh import SH_C0, SH_C1, sh_basis
from gpucheck.reference import rasterize

F64 = torch.float64


@pytest.fixture
def gen() -> torch.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")  # shown by pytest when a test fails
    return torch.Generator().manual_seed(seed)


def intrinsics(fx: float, fy: float, cx: float, cy: float) -> torch.Tensor:
    return torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=F64)


def identity_quats(n: int) -> torch.Tensor:
    return torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=F64).repeat(n, 1)


def hamilton(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    w1, x1, y1, z1 = p
    w2, x2, y2, z2 = q
    return np.array(
        [
            w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
            w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
            w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
            w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
        ]
    )


def rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Rotate v by quaternion q (wxyz) as q v q*, independent of any matrix formula."""
    q = q / np.linalg.norm(q)
    conj = q * np.array([1.0, -1.0, -1.0, -1.0])
    return hamilton(hamilton(q, np.concatenate([[0.0], v])), conj)[1:]


def random_viewmat(gen: torch.Generator) -> torch.Tensor:
    q = torch.randn(4, generator=gen, dtype=F64).numpy()
    rot = np.stack([rotate(q, e) for e in np.eye(3)], axis=1)  # columns: images of axes
    view = np.eye(4)
    view[:3, :3] = rot
    view[:3, 3] = torch.randn(3, generator=gen, dtype=F64).numpy()
    return torch.from_numpy(view)


def sequential_composite(
    res, width: int, height: int, opacities: torch.Tensor, background: torch.Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """A kernel-style loop per pixel over depth-sorted Gaussians, with skip/clamp/stop."""
    m2d, con = res.means2d.detach().numpy(), res.conics.detach().numpy()
    col, dep = res.colors.detach().numpy(), res.depths.detach().numpy()
    tiles, op = res.tiles.numpy(), opacities.detach().numpy()
    # front to back by the float32 depth (the kernel's sort key), ties in index order
    order = sorted(
        (i for i in range(len(op)) if res.radii[i] > 0), key=lambda i: (np.float32(dep[i]), i)
    )
    image = np.zeros((3, height, width))
    alpha = np.zeros((height, width))
    for py in range(height):
        for px in range(width):
            t, c = 1.0, np.zeros(3)
            for i in order:
                x0, y0, x1, y1 = tiles[i]
                if not (x0 <= px // 16 < x1 and y0 <= py // 16 < y1):
                    continue
                dx, dy = m2d[i, 0] - (px + 0.5), m2d[i, 1] - (py + 0.5)
                power = -0.5 * (con[i, 0] * dx * dx + con[i, 2] * dy * dy) - con[i, 1] * dx * dy
                if power > 0:
                    continue
                a = min(0.99, op[i] * math.exp(power))
                if a < 1 / 255:
                    continue
                if t * (1 - a) < 1e-4:
                    break
                c += col[i] * a * t
                t *= 1 - a
            image[:, py, px] = c + t * background.numpy()
            alpha[py, px] = 1 - t
    return image, alpha


def footprint_alphas(res, opacities: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """[N, H, W] unclamped opacity * exp(power) of each Gaussian at every pixel centre."""
    ys, xs = torch.meshgrid(
        torch.arange(height, dtype=F64) + 0.5, torch.arange(width, dtype=F64) + 0.5, indexing="ij"
    )
    m, con = res.means2d.detach(), res.conics.detach()
    dx, dy = m[:, 0, None, None] - xs, m[:, 1, None, None] - ys
    power = (
        -0.5 * (con[:, 0, None, None] * dx * dx + con[:, 2, None, None] * dy * dy)
        - con[:, 1, None, None] * dx * dy
    )
    return opacities.detach()[:, None, None] * torch.exp(power)


def test_single_isotropic_gaussian_closed_form() -> None:
    """On the optical axis at depth z, an isotropic Gaussian of scale s is a circular 2D
    Gaussian with variance (s fx / z)^2 + 0.3 centred on the principal point."""
    width, height, z, s, fx, op = 13, 15, 3.0, 0.12, 25.0, 0.8
    cx, cy = 6.5, 7.5  # the centre of pixel (row 7, col 6)
    color, bg = [0.9, 0.2, 0.4], [0.1, 0.3, 0.05]
    res = rasterize(
        torch.tensor([[0.0, 0.0, z]], dtype=F64),
        torch.full((1, 3), s, dtype=F64),
        identity_quats(1),
        torch.tensor([op], dtype=F64),
        colors=torch.tensor([color], dtype=F64),
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(fx, fx, cx, cy),
        width=width,
        height=height,
        background=torch.tensor(bg, dtype=F64),
    )
    var = (s * fx / z) ** 2 + 0.3
    want = np.zeros((3, height, width))
    want_alpha = np.zeros((height, width))
    for i in range(height):
        for j in range(width):
            a = min(0.99, op * math.exp(-0.5 * ((j + 0.5 - cx) ** 2 + (i + 0.5 - cy) ** 2) / var))
            a = a if a >= 1 / 255 else 0.0
            want_alpha[i, j] = a
            want[:, i, j] = [c * a + b * (1 - a) for c, b in zip(color, bg, strict=True)]
    assert (want_alpha == 0).any() and (want_alpha > 0).any()  # both regimes exercised
    np.testing.assert_allclose(res.image.numpy(), want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(res.alpha.numpy(), want_alpha, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(res.depth.numpy(), np.where(want_alpha > 0, z, 0.0), rtol=1e-12)
    assert res.radii.tolist() == [math.ceil(3 * math.sqrt(var + math.sqrt(0.1)))]
    assert res.means2d.tolist() == [[cx, cy]]
    assert res.n_intersections == 1 and res.tiles.tolist() == [[0, 0, 1, 1]]


def test_covariance_matches_numerical_jacobian(gen: torch.Generator) -> None:
    n, width, height = 6, 40, 30
    K = intrinsics(35.0, 30.0, 21.0, 14.0)
    view = random_viewmat(gen)
    # means in front of the camera and inside the view, so the Jacobian clamp is inactive
    cam = torch.stack(
        [
            (torch.rand(n, generator=gen, dtype=F64) - 0.5) * 0.6,
            (torch.rand(n, generator=gen, dtype=F64) - 0.5) * 0.6,
            2.0 + torch.rand(n, generator=gen, dtype=F64),
        ],
        dim=1,
    )
    inv = torch.linalg.inv(view)
    means = cam @ inv[:3, :3].T + inv[:3, 3]
    scales = 0.02 + 0.2 * torch.rand(n, 3, generator=gen, dtype=F64)
    quats = torch.randn(n, 4, generator=gen, dtype=F64)
    res = rasterize(
        means,
        scales,
        quats,
        torch.full((n,), 0.5, dtype=F64),
        colors=torch.rand(n, 3, generator=gen, dtype=F64),
        viewmat=view,
        K=K,
        width=width,
        height=height,
    )
    Kn, Vn = K.numpy(), view.numpy()

    def pixel(p: np.ndarray) -> np.ndarray:
        c = Vn[:3, :3] @ p + Vn[:3, 3]
        return np.array([Kn[0, 0] * c[0] / c[2] + Kn[0, 2], Kn[1, 1] * c[1] / c[2] + Kn[1, 2]])

    for g in range(n):
        p, h = means[g].numpy(), 1e-6
        jac = np.stack(
            [(pixel(p + h * e) - pixel(p - h * e)) / (2 * h) for e in np.eye(3)], axis=1
        )  # d pixel / d world
        rot = np.stack([rotate(quats[g].numpy(), e) for e in np.eye(3)], axis=1)
        sigma = rot @ np.diag(scales[g].numpy() ** 2) @ rot.T
        cov2d = jac @ sigma @ jac.T + 0.3 * np.eye(2)
        a, b, c = res.conics[g].tolist()
        np.testing.assert_allclose(np.array([[a, b], [b, c]]) @ cov2d, np.eye(2), atol=1e-7)
        np.testing.assert_allclose(res.means2d[g].detach().numpy(), pixel(p), rtol=1e-12)
        lo, hi = np.linalg.eigvalsh(cov2d)
        lam = (lo + hi) / 2 + max(math.sqrt(0.1), (hi - lo) / 2)
        assert int(res.radii[g]) == math.ceil(3 * math.sqrt(lam))
        assert float(res.depths[g]) == pytest.approx(float(cam[g, 2]), rel=1e-12)


def test_jacobian_is_clamped_outside_the_view() -> None:
    """Off-screen Gaussians use the Jacobian at x/z, y/z clamped to 1.3x the half field of
    view from the principal point (here off-centre), as in 3DGS and gsplat."""
    width, height, fx, fy, cx, cy = 20, 10, 10.0, 12.0, 6.0, 7.0
    lim_x = ((width - cx) / fx + 0.3 * width / (2 * fx), -(cx / fx + 0.3 * width / (2 * fx)))
    lim_y = ((height - cy) / fy + 0.3 * height / (2 * fy), -(cy / fy + 0.3 * height / (2 * fy)))
    z = 2.0
    cases = [
        (5.0, 0.1, lim_x[0], 0.1),
        (-4.0, -3.0, lim_x[1], lim_y[1]),
        (0.3, 2.5, 0.3, lim_y[0]),
        (0.2, -0.1, 0.2, -0.1),
    ]  # the last one: no clamp
    means = torch.tensor([[u * z, v * z, z] for u, v, _, _ in cases], dtype=F64)
    scales = torch.tensor([[0.3, 0.1, 0.2]], dtype=F64).repeat(len(cases), 1)
    res = rasterize(
        means,
        scales,
        identity_quats(len(cases)),
        torch.full((len(cases),), 0.5, dtype=F64),
        colors=torch.ones(len(cases), 3, dtype=F64),
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(fx, fy, cx, cy),
        width=width,
        height=height,
    )
    for g, (_, _, uc, vc) in enumerate(cases):
        jac = np.array([[fx / z, 0.0, -fx * uc / z], [0.0, fy / z, -fy * vc / z]])
        cov2d = jac @ np.diag(scales[g].numpy() ** 2) @ jac.T + 0.3 * np.eye(2)
        a, b, c = res.conics[g].tolist()
        np.testing.assert_allclose(np.array([[a, b], [b, c]]) @ cov2d, np.eye(2), atol=1e-12)


def test_sh_basis_is_orthonormal_on_the_sphere() -> None:
    """Gauss–Legendre in cos(theta) × uniform phi integrates these degree <= 6 products
    exactly, so the constants must give the identity Gram matrix."""
    nodes, weights = np.polynomial.legendre.leggauss(12)
    phi = np.arange(24) * 2 * np.pi / 24
    ct, ph = np.meshgrid(nodes, phi, indexing="ij")
    st = np.sqrt(1 - ct**2)
    dirs = torch.from_numpy(np.stack([st * np.cos(ph), st * np.sin(ph), ct], -1).reshape(-1, 3))
    w = torch.from_numpy(np.repeat(weights, 24) * (2 * np.pi / 24))
    basis = sh_basis(dirs, 3)
    gram = basis.T @ (basis * w[:, None])
    torch.testing.assert_close(gram, torch.eye(16, dtype=F64), rtol=0, atol=1e-12)
    # 3DGS's sign convention for degree 1: (-C1 y, C1 z, -C1 x)
    one = sh_basis(torch.tensor([[0.6, 0.0, 0.8], [0.0, 1.0, 0.0]], dtype=F64), 1)
    torch.testing.assert_close(
        one, torch.tensor([[SH_C0, 0, 0.8 * SH_C1, -0.6 * SH_C1], [SH_C0, -SH_C1, 0, 0]], dtype=F64)
    )


def test_sh_colours_use_direction_from_camera_centre(gen: torch.Generator) -> None:
    n = 5
    centre = torch.tensor([0.3, -0.2, -1.0], dtype=F64)
    view = torch.eye(4, dtype=F64)
    view[:3, 3] = -centre  # camera at `centre`
    means = torch.rand(n, 3, generator=gen, dtype=F64) - 0.5
    sh = 0.4 * torch.randn(n, 4, 3, generator=gen, dtype=F64)
    kw = dict(viewmat=view, K=intrinsics(20.0, 20.0, 8.0, 8.0), width=16, height=16)
    common = (
        means,
        torch.full((n, 3), 0.05, dtype=F64),
        identity_quats(n),
        torch.full((n,), 0.5, dtype=F64),
    )
    deg0 = rasterize(*common, sh=sh[:, :1], **kw).colors
    torch.testing.assert_close(deg0, (SH_C0 * sh[:, 0] + 0.5).clamp_min(0), rtol=1e-14, atol=0)
    d = means - centre
    x, y, z = (d / d.norm(dim=1, keepdim=True)).unbind(1)
    want = (
        SH_C0 * sh[:, 0]
        + SH_C1 * (-y[:, None] * sh[:, 1] + z[:, None] * sh[:, 2] - x[:, None] * sh[:, 3])
        + 0.5
    )
    torch.testing.assert_close(
        rasterize(*common, sh=sh, **kw).colors, want.clamp_min(0), rtol=1e-13, atol=1e-15
    )
    # sh_degree 0 on degree-1 coefficients ignores the higher ones
    torch.testing.assert_close(rasterize(*common, sh=sh, sh_degree=0, **kw).colors, deg0)


def _stack_scene(depths: list[float], opacities: list[float]):
    n = len(depths)
    means = torch.tensor([[0.0, 0.0, z] for z in depths], dtype=F64)
    colors = torch.eye(3, dtype=F64)[torch.arange(n) % 3] * 0.7 + 0.1
    return (
        means,
        torch.full((n, 3), 1.0, dtype=F64),
        identity_quats(n),
        torch.tensor(opacities, dtype=F64),
        colors,
    )


def test_occlusion_order_and_transmittance_stop() -> None:
    kw = dict(
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(10.0, 10.0, 3.5, 2.5),
        width=7,
        height=5,
        background=torch.tensor([0.2, 0.4, 0.6], dtype=F64),
    )
    means, scales, quats, op, colors = _stack_scene([2.0, 5.0], [1.0, 0.6])
    two = rasterize(means, scales, quats, op, colors=colors, **kw)
    centre = (2, 3)  # pixel at the principal point: power 0
    a2 = 0.6
    want = 0.99 * colors[0] + 0.01 * a2 * colors[1] + 0.01 * (1 - a2) * kw["background"]
    torch.testing.assert_close(two.image[:, centre[0], centre[1]], want, rtol=1e-13, atol=0)
    w1, w2 = 0.99, 0.01 * a2
    assert float(two.depth[centre]) == pytest.approx((2 * w1 + 5 * w2) / (w1 + w2), rel=1e-13)
    # the order of the inputs does not matter: sorting is by camera depth
    flip = rasterize(means.flip(0), scales, quats, op.flip(0), colors=colors.flip(0), **kw)
    torch.testing.assert_close(flip.image, two.image, rtol=1e-14, atol=0)

    # three opaque ones: T = 0.01 after the first, 1e-4 after the second (kept: not below
    # 1e-4), the third would take it to 1e-6 < 1e-4, so it and all behind it are dropped.
    means, scales, quats, op, colors = _stack_scene([2.0, 3.0, 4.0, 6.0], [1.0, 1.0, 1.0, 0.3])
    four = rasterize(means, scales, quats, op, colors=colors, **kw)
    two_only = rasterize(means[:2], scales[:2], quats[:2], op[:2], colors=colors[:2], **kw)
    pix = four.image[:, centre[0], centre[1]]
    want = 0.99 * colors[0] + 0.99 * 0.01 * colors[1] + 0.01 * 0.01 * kw["background"]
    torch.testing.assert_close(pix, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(pix, two_only.image[:, centre[0], centre[1]], rtol=0, atol=0)
    assert float(four.alpha[centre]) == pytest.approx(1 - 1e-4, rel=1e-12)


def test_depth_ties_at_float32_resolution_composite_in_index_order() -> None:
    """Depths that round to one float32 (here 2 - 2e-8 and 2, one float32 ulp is 2.4e-7)
    composite in index order, as the float32 kernel's stable sort on float32 depths does,
    not in float64 depth order; a gap of a few float32 ulps is ordered by depth. Decides
    here which of the two the 1e-4 stop drops (a case that regressed once)."""
    kw = dict(
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(10.0, 10.0, 0.5, 0.5),
        width=1,
        height=1,
        background=torch.zeros(3, dtype=F64),
    )
    # T = 0.01 * 0.0125 = 1.25e-4 after the first two. In index order the 0.1 one takes it to
    # 1.125e-4 and the 0.5 one stops the pixel; in depth order the 0.5 one stops it at once.
    for gap, third in ((2e-8, True), (1e-6, False)):
        means, scales, quats, op, colors = _stack_scene(
            [1.0, 1.5, 2.0, 2.0 - gap], [0.99, 0.9875, 0.1, 0.5]
        )
        z = means[:, 2]
        assert (z[2].float() == z[3].float()) == third and bool(z[3] < z[2])
        res = rasterize(means, scales, quats, op, colors=colors, **kw)
        t = 0.01 * 0.0125
        want = 0.99 * colors[0] + 0.01 * 0.9875 * colors[1] + third * t * 0.1 * colors[2]
        torch.testing.assert_close(res.image[:, 0, 0], want, rtol=1e-12, atol=0)
        t_final = t * 0.9 if third else t
        assert float(res.alpha[0, 0]) == pytest.approx(1 - t_final, rel=1e-12)
    order = splat.compositing_order(
        torch.tensor([3.0, 2.0 + 1e-8, 2.0, 1.0], dtype=F64), torch.tensor([0, 1, 2, 3])
    )
    assert order.tolist() == [3, 1, 2, 0]


def test_threshold_equality_semantics(monkeypatch: pytest.MonkeyPatch) -> None:
    """alpha == ALPHA_MIN is composited and T == T_MIN afterwards is kept (3DGS skips only
    alpha < 1/255 and stops only at T < 1e-4); checked with thresholds made exact in binary."""
    monkeypatch.setattr(splat, "T_MIN", 0.25)
    monkeypatch.setattr(splat, "ALPHA_MIN", 0.5)
    kw = dict(
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(10.0, 10.0, 0.5, 0.5),
        width=1,
        height=1,
        background=torch.zeros(3, dtype=F64),
    )
    means, scales, quats, op, colors = _stack_scene([2.0, 3.0, 4.0], [0.5, 0.5, 0.5])
    res = rasterize(means, scales, quats, op, colors=colors, **kw)  # alpha = op at the centre
    want = 0.5 * colors[0] + 0.25 * colors[1]  # T: 1 -> 0.5 -> 0.25 (kept) -> stop
    torch.testing.assert_close(res.image[:, 0, 0], want, rtol=0, atol=0)
    assert float(res.alpha[0, 0]) == 0.75
    res = rasterize(means, scales, quats, op.nextafter(torch.zeros(())), colors=colors, **kw)
    assert float(res.alpha[0, 0]) == 0.0  # just below ALPHA_MIN: all skipped


def test_matches_sequential_kernel_loop(gen: torch.Generator) -> None:
    n, width, height = 60, 21, 13  # two tiles wide, not tile multiples
    means = torch.stack(
        [
            (torch.rand(n, generator=gen, dtype=F64) - 0.5) * 2.5,
            (torch.rand(n, generator=gen, dtype=F64) - 0.5) * 1.5,
            1.5 + 2 * torch.rand(n, generator=gen, dtype=F64),
        ],
        dim=1,
    )
    scales = 0.05 + 0.3 * torch.rand(n, 3, generator=gen, dtype=F64)
    quats = torch.randn(n, 4, generator=gen, dtype=F64)
    op = 0.6 + 0.4 * torch.rand(n, generator=gen, dtype=F64)  # many pixels hit the stop
    sh = 0.5 * torch.randn(n, 9, 3, generator=gen, dtype=F64)
    bg = torch.rand(3, generator=gen, dtype=F64)
    view = random_viewmat(gen)  # means above are camera-space: to world
    inv = torch.linalg.inv(view)
    res = rasterize(
        means @ inv[:3, :3].T + inv[:3, 3],
        scales,
        quats,
        op,
        sh=sh,
        viewmat=view,
        K=intrinsics(12.0, 12.0, 10.0, 6.0),
        width=width,
        height=height,
        background=bg,
    )
    image, alpha = sequential_composite(res, width, height, op, bg)
    assert (alpha > 0.999).any() and (res.radii > 0).sum() > n // 2
    np.testing.assert_allclose(res.image.detach().numpy(), image, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.alpha.detach().numpy(), alpha, rtol=1e-10, atol=1e-12)


def test_tile_rectangle_limits_the_footprint() -> None:
    """An opaque Gaussian whose 3-sigma square ends at the tile edge x = 16 leaves the next
    tile untouched even where its alpha would still be above 1/255."""
    fx, z, cx, cy = 20.0, 2.0, 10.0, 5.5
    var_x, var_y = 4.0, 1.0  # 2D variances, low-pass included
    scales = torch.tensor(
        [[math.sqrt(var_x - 0.3) * z / fx, math.sqrt(var_y - 0.3) * z / fx, 0.01]], dtype=F64
    )
    res = rasterize(
        torch.tensor([[0.0, 0.0, z]], dtype=F64),
        scales,
        identity_quats(1),
        torch.tensor([1.0], dtype=F64),
        colors=torch.ones(1, 3, dtype=F64),
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(fx, fx, cx, cy),
        width=21,
        height=11,
    )
    assert res.radii.tolist() == [6] and res.tiles.tolist() == [[0, 0, 1, 1]]
    row = 5  # pixel centres at y = 5.5 = cy
    for col in (15, 16):
        would_be = min(0.99, math.exp(-0.5 * (col + 0.5 - cx) ** 2 / var_x))
        assert would_be > 1 / 255
        assert float(res.alpha[row, col]) == (
            pytest.approx(would_be, rel=1e-12) if col < 16 else 0.0
        )


def test_tile_box_is_opacity_aware_per_axis() -> None:
    """Closed form: an axis-aligned Gaussian with 2D variances 100 and 4 (low-pass included)
    at screen (40.3, 30.2) has radius 30, so its square spans tiles x 0..4, y 0..3; its box
    for opacity 0.5 is sqrt(2 ln 127.5) = 3.11 sigma per axis: +-31.1 px in x (wider than the
    square, which limits it) and +-6.2 px in y (tiles 1..2). Below opacity 1/255 it keeps its
    radius but touches no tile and changes no pixel."""
    fx, z, cx, cy, width, height = 20.0, 2.0, 40.3, 30.2, 128, 96
    scales = torch.tensor(
        [[math.sqrt(100 - 0.3) * z / fx, math.sqrt(4 - 0.3) * z / fx, 0.01]], dtype=F64
    )
    kw = dict(
        colors=torch.ones(1, 3, dtype=F64),
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(fx, fx, cx, cy),
        width=width,
        height=height,
    )
    means = torch.tensor([[0.0, 0.0, z]], dtype=F64)
    res = rasterize(means, scales, identity_quats(1), torch.tensor([0.5], dtype=F64), **kw)
    ey = math.sqrt(2 * math.log(255 * 0.5) * 4)
    assert math.floor((cy - ey) / 16) == 1 and math.ceil((cy + ey) / 16) == 3
    assert res.radii.tolist() == [30] and res.tiles.tolist() == [[0, 1, 5, 3]]
    assert res.n_intersections == 10  # the square: 5 x 4 = 20
    assert float(res.alpha[16:48].min()) == 0 and float(res.alpha[30].max()) > 0.4
    faint = rasterize(
        means, scales, identity_quats(1), torch.tensor([0.999 / 255], dtype=F64), **kw
    )
    assert faint.radii.tolist() == [30] and faint.tiles.tolist() == [[0, 0, 0, 0]]
    assert faint.n_intersections == 0 and not bool(faint.alpha.any())


def _opacity_scene(gen: torch.Generator, n: int, width: int, height: int, f: float) -> dict:
    """Gaussians of every opacity regime (below 1/255, within rounding above it, faint,
    opaque), round, thin and tilted (skews Sxx Syy / det up to ~1e4), some off-screen."""
    z = 1.5 + 4 * torch.rand(n, generator=gen, dtype=F64)
    cam = torch.stack(
        [
            (torch.rand(n, generator=gen, dtype=F64) - 0.5) * 1.4 * width / f * z,
            (torch.rand(n, generator=gen, dtype=F64) - 0.5) * 1.4 * height / f * z,
            z,
        ],
        dim=1,
    )
    view = random_viewmat(gen)
    inv = torch.linalg.inv(view)
    scales = torch.exp(-4 + 3 * torch.rand(n, 3, generator=gen, dtype=F64))
    thin = torch.rand(n, generator=gen) < 0.4
    scales[thin, 1:] *= 1e-3  # needles, projected at every angle
    choices = torch.tensor(
        [0.002, 1 / 255, float(np.float32(1 / 255)), 0.0045, 0.02, 0.3, 1.0], dtype=F64
    )
    op = choices[torch.randint(len(choices), (n,), generator=gen)]
    mixed = torch.rand(n, generator=gen) < 0.3
    op[mixed] = torch.rand(int(mixed.sum()), generator=gen, dtype=F64)
    return dict(
        means=cam @ inv[:3, :3].T + inv[:3, 3],
        scales=scales,
        rotations=torch.randn(n, 4, generator=gen, dtype=F64),
        opacities=op,
        colors=torch.rand(n, 3, generator=gen, dtype=F64),
        viewmat=view,
        K=intrinsics(f, f * 1.1, width / 2 + 0.3, height / 2 - 0.2),
        width=width,
        height=height,
        background=torch.rand(3, generator=gen, dtype=F64),
    )


def _square_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference as it was: every Gaussian binned into its whole 3-sigma square."""
    monkeypatch.setattr(
        splat,
        "_tile_box",
        lambda sxx, syy, det, m, o: (
            torch.full_like(m, math.inf),
            torch.ones_like(o, dtype=torch.bool),
        ),
    )


@pytest.mark.parametrize("dense", [False, True], ids=["sparse", "dense"])
def test_tile_box_changes_no_output(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch, dense: bool
) -> None:
    """Binning into the opacity-aware box instead of the whole square drops tiles but changes
    no output and no gradient: the dropped (Gaussian, tile) pairs have alpha < 1/255 at
    every pixel. Also the box's rectangle never leaves the square."""
    n, width, height = (400, 64, 48) if dense else (150, 45, 37)
    args = _opacity_scene(gen, n, width, height, 40.0 if dense else 25.0)
    leaves = ("means", "scales", "rotations", "opacities", "colors", "background")
    w = [
        torch.randn(3, height, width, generator=gen, dtype=F64),
        torch.randn(height, width, generator=gen, dtype=F64),
        torch.randn(height, width, generator=gen, dtype=F64),
        torch.randn(n, 2, generator=gen, dtype=F64),
    ]

    def run() -> tuple:
        inputs = {k: args[k].clone().requires_grad_() for k in leaves}
        res = rasterize(**{**args, **inputs})
        loss = (
            (res.image * w[0]).sum()
            + (res.alpha * w[1]).sum()
            + (res.depth * w[2]).sum()
            + (res.means2d * w[3]).sum()
        )
        loss.backward()
        grads = [inputs[k].grad for k in leaves] + [res.means2d.grad]
        return res, grads

    tight, tight_grads = run()
    with monkeypatch.context() as m:
        _square_only(m)
        square, square_grads = run()
    assert torch.equal(tight.radii, square.radii)
    vis = square.radii > 0
    some = tight.tiles[:, 2] > tight.tiles[:, 0]
    assert bool((vis | ~some).all())  # only visible ones touch tiles
    t, q = tight.tiles[some], square.tiles[some]
    assert bool(((t[:, :2] >= q[:, :2]) & (t[:, 2:] <= q[:, 2:])).all())
    assert bool((tight.tiles[~some] == 0).all())
    assert bool((vis & ~some).any())  # faint ones: visible, no tile
    assert tight.n_intersections < 0.9 * square.n_intersections
    for a, b in zip(tight[:3], square[:3], strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-13)
    assert float(tight.alpha.detach().max()) > 0.5
    for a, b in zip(tight_grads, square_grads, strict=True):
        assert a is not None and b is not None
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12 * max(1.0, float(b.abs().max())))


def _float32_hits(
    m: np.ndarray, con: np.ndarray, op: np.float32, px: np.ndarray, py: np.ndarray
) -> np.ndarray:
    """Where the kernel composites one Gaussian, emulated in float32 operation by operation
    (exponent_coefficients, exponent_column and gaussian_power of csrc/splat/splat_device.cuh,
    its fmas as one float64 rounding then one to float32; gaussian_exp: 2^(power log2 e); the
    clamp and the 1/255 skip): ``m`` [2] its float32 screen mean, ``con`` [3] its float32
    conic, ``px``, ``py`` float32 pixel centres."""
    f32 = np.float32

    def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        return (a.astype(np.float64) * b + c).astype(f32)

    ca, cb, cc = f32(-0.5) * con[0], -con[1], f32(-0.5) * con[2]
    dx, dy = m[0] - px, m[1] - py
    power = fma(dy, fma(cc, dy, cb * dx), (ca * dx) * dx)
    with np.errstate(over="ignore", under="ignore"):
        alpha = np.minimum(f32(0.99), op * np.exp2(power * f32(math.log2(math.e))))
    return (power <= 0) & (alpha >= f32(1 / 255))


def _square_tiles(res, g: int, grid: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    m, r = res.means2d[g].detach().numpy(), int(res.radii[g])
    return (
        np.clip(np.floor((m - r) / 16), 0, grid).astype(int),
        np.clip(np.ceil((m + r) / 16), 0, grid).astype(int),
    )


def test_float32_alpha_stays_inside_the_tile_box(gen: torch.Generator) -> None:
    """The kernel's float32 alpha reaches 1/255 only at pixels inside the reference's tile
    rectangle (of those of its square: the kernel composites nowhere else), on a scene of
    every opacity regime, round and thin Gaussians, every pixel of the image checked."""
    n, width, height = 300, 96, 80
    args = _opacity_scene(gen, n, width, height, 60.0)
    res = rasterize(**args)
    f32 = np.float32
    m = res.means2d.detach().numpy().astype(f32)
    con = res.conics.detach().numpy().astype(f32)
    op = args["opacities"].numpy().astype(f32)
    py, px = np.meshgrid(
        np.arange(height, dtype=f32) + f32(0.5),
        np.arange(width, dtype=f32) + f32(0.5),
        indexing="ij",
    )
    tx, ty = px // 16, py // 16
    reached = 0
    for g in np.nonzero(res.radii.numpy() > 0)[0]:
        hit = _float32_hits(m[g], con[g], op[g], px, py)
        x0, y0, x1, y1 = res.tiles[g].tolist()
        lo, hi = _square_tiles(res, g, (-(-width // 16), -(-height // 16)))
        square = (tx >= lo[0]) & (tx < hi[0]) & (ty >= lo[1]) & (ty < hi[1])
        inside = (tx >= x0) & (tx < x1) & (ty >= y0) & (ty < y1)
        assert not bool((hit & square & ~inside).any()), f"Gaussian {g}: alpha >= 1/255 off"
        reached += int(hit.any())
    assert reached > n // 4


def test_float32_alpha_of_needles_stays_inside_the_tile_box(gen: torch.Generator) -> None:
    """Opaque needles at every angle, 100-700 px long and as thin as the low-pass, in a
    4096x4096 image: skews Sxx Syy / det ~1e4-4e5, where float32 rounding moves the exponent
    most (the reason for the TILE_BOX_* margins: without them the float32 alpha reaches 1/255
    beyond the box on such scenes; above TILE_BOX_MAX_SKEW the square is used). Checked: the
    pixels of the tiles just outside the rectangle, within the square."""
    n, size, f, z = 200, 4096, 500.0, 2.0
    angle = torch.rand(n, generator=gen, dtype=F64) * math.pi
    zeros = torch.zeros(n, dtype=F64)
    quats = torch.stack([torch.cos(angle / 2), zeros, zeros, torch.sin(angle / 2)], dim=1)
    length = 100 * torch.exp(math.log(7) * torch.rand(n, generator=gen, dtype=F64)) * z / f
    scales = torch.stack([length, zeros + 1e-6, zeros + 1e-6], dim=1)
    means = torch.cat(
        [
            (torch.rand(n, 2, generator=gen, dtype=F64) - 0.5) * 0.2 * size / f * z,
            zeros[:, None] + z,
        ],
        dim=1,
    )
    op = 0.9 + 0.1 * torch.rand(n, generator=gen, dtype=F64)
    res = splat.project(
        means,
        scales,
        quats,
        torch.eye(4, dtype=F64),  # no compositing
        intrinsics(f, f, size / 2 + 0.3, size / 2 - 0.2),
        size,
        size,
        op,
    )
    cov = torch.linalg.inv(torch.stack([res.conics[:, [0, 1]], res.conics[:, [1, 2]]], dim=1))
    skew = cov[:, 0, 0] * cov[:, 1, 1] / torch.linalg.det(cov)
    assert float(skew.max()) > 1e5 and bool((res.radii > 0).all())
    f32 = np.float32
    m = res.means2d.detach().numpy().astype(f32)
    con = res.conics.detach().numpy().astype(f32)
    strips = 0
    for g in range(n):
        x0, y0, x1, y1 = res.tiles[g].tolist()
        assert x1 > x0 and y1 > y0, f"needle {g} touches no tile"
        lo, hi = _square_tiles(res, g, (size // 16, size // 16))
        ring = [
            (x1, x1 + 1, lo[1], hi[1]),
            (x0 - 1, x0, lo[1], hi[1]),
            (lo[0], hi[0], y1, y1 + 1),
            (lo[0], hi[0], y0 - 1, y0),
        ]
        for tx0, tx1, ty0, ty1 in ring:
            if tx0 < lo[0] or tx1 > hi[0] or ty0 < lo[1] or ty1 > hi[1]:
                continue  # beyond the square
            py, px = np.meshgrid(
                np.arange(16 * ty0, 16 * ty1, dtype=f32) + f32(0.5),
                np.arange(16 * tx0, 16 * tx1, dtype=f32) + f32(0.5),
                indexing="ij",
            )
            hit = _float32_hits(m[g], con[g], f32(op[g]), px, py)
            assert not bool(hit.any()), f"needle {g} (skew {float(skew[g]):.3g}): off its tiles"
            strips += 1
    assert strips > n


def test_background_and_culling() -> None:
    bg = torch.tensor([0.25, 0.5, 0.75], dtype=F64)
    means = torch.tensor(
        [[0.0, 0.0, 0.2], [0.0, 0.0, -3.0], [0.0, 0.0, 0.1], [0.0, 0.0, 3.0]],
        dtype=F64,
        requires_grad=True,
    )
    op = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=F64)
    colors = torch.rand(4, 3, dtype=F64)
    res = rasterize(
        means,
        torch.full((4, 3), 0.01, dtype=F64),
        identity_quats(4),
        op,
        colors=colors,
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(10.0, 10.0, 30.0, 4.0),
        width=40,
        height=8,
        background=bg,
    )
    assert res.radii.tolist()[:3] == [0, 0, 0] and int(res.radii[3]) > 0
    # the visible one is small and sits at x = 30: the left half is pure background
    torch.testing.assert_close(
        res.image[:, :, :20], bg[:, None, None].expand(3, 8, 20), rtol=0, atol=0
    )
    assert float(res.alpha[:, :20].detach().abs().max()) == 0
    assert float(res.depth[:, :20].detach().max()) == 0
    res.image.sum().backward()
    grad = means.grad
    assert grad is not None and torch.isfinite(grad).all()
    assert grad[:3].abs().max() == 0 and grad[3].abs().max() > 0


@pytest.mark.parametrize(("n", "width", "height"), [(0, 5, 4), (1, 1, 1), (3, 21, 13), (4, 17, 33)])
def test_sizes(gen: torch.Generator, n: int, width: int, height: int) -> None:
    means = torch.cat(
        [torch.rand(n, 2, generator=gen, dtype=F64) - 0.5, torch.full((n, 1), 2.0, dtype=F64)],
        dim=1,
    )
    bg = torch.rand(3, generator=gen, dtype=F64)
    res = rasterize(
        means,
        torch.full((n, 3), 0.3, dtype=F64),
        identity_quats(n),
        torch.full((n,), 0.7, dtype=F64),
        colors=torch.rand(n, 3, dtype=F64),
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(float(width), float(width), width / 2, height / 2),
        width=width,
        height=height,
        background=bg,
    )
    assert res.image.shape == (3, height, width) and res.alpha.shape == (height, width)
    assert res.depth.shape == (height, width) and res.radii.shape == (n,)
    assert res.means2d.shape == (n, 2) and res.radii.dtype == torch.int32
    image, alpha = sequential_composite(res, width, height, torch.full((n,), 0.7, dtype=F64), bg)
    np.testing.assert_allclose(res.image.numpy(), image, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(res.alpha.numpy(), alpha, rtol=1e-12, atol=1e-14)
    if n == 0:
        torch.testing.assert_close(res.image, bg[:, None, None].expand(3, height, width))
    else:
        assert (res.radii > 0).all() and float(res.alpha.max()) > 0.5


def _tiny_scene(gen: torch.Generator) -> tuple[tuple[torch.Tensor, ...], torch.Tensor] | None:
    """Random inputs of the gradcheck scene, or None when a draw lands near a threshold."""
    n = 3
    means = torch.cat(
        [
            (torch.rand(n, 2, generator=gen, dtype=F64) - 0.5) * 0.2,
            2.0 + torch.rand(n, 1, generator=gen, dtype=F64),
        ],
        dim=1,
    )
    scales = 0.5 + 0.3 * torch.rand(n, 3, generator=gen, dtype=F64)
    quats = torch.randn(n, 4, generator=gen, dtype=F64)
    op = 0.3 + 0.4 * torch.rand(n, generator=gen, dtype=F64)
    sh = 0.3 * torch.randn(n, 4, 3, generator=gen, dtype=F64)
    bg = torch.rand(3, generator=gen, dtype=F64)
    K = intrinsics(8.0, 8.0, 4.0, 3.0)
    with torch.no_grad():
        r = rasterize(
            means, scales, quats, op, sh=sh, viewmat=torch.eye(4, dtype=F64), K=K, width=8, height=6
        )
        each = footprint_alphas(r, op, 8, 6)
        if not (
            float(each.min()) > 2 / 255
            and float(each.max()) < 0.98
            and r.tiles.tolist() == [[0, 0, 1, 1]] * n
            and float(r.alpha.max()) < 0.99
        ):
            return None
    return (means, scales, quats, op, sh, bg), K


def test_gradcheck_tiny_scene(gen: torch.Generator) -> None:
    """All alphas stay inside (1/255, 0.99) and T above 1e-4, away from every threshold
    (draws that land near one, about 4 %, are drawn again)."""
    drawn = None
    for _ in range(50):
        if (drawn := _tiny_scene(gen)) is not None:
            break
    assert drawn is not None, "no scene away from the thresholds in 50 draws"
    tensors, K = drawn
    inputs = tuple(t.requires_grad_() for t in tensors)
    with torch.no_grad():
        r = rasterize(
            *inputs[:4], sh=inputs[4], viewmat=torch.eye(4, dtype=F64), K=K, width=8, height=6
        )

    def render(m, s, q, o, h, b):
        r = rasterize(
            m, s, q, o, sh=h, viewmat=torch.eye(4, dtype=F64), K=K, width=8, height=6, background=b
        )
        return r.image, r.alpha, r.depth

    # every output element (random projections), then every input element of a weighted sum
    assert torch.autograd.gradcheck(render, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)
    w = [torch.rand(t.shape, generator=gen, dtype=F64) for t in (r.image, r.alpha, r.depth)]

    def loss(*args: torch.Tensor) -> torch.Tensor:
        return sum((o * wi).sum() for o, wi in zip(render(*args), w, strict=True))

    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_means2d_gradient_matches_closed_form(gen: torch.Generator) -> None:
    """One Gaussian: the image as a function of its screen mean, written out by hand."""
    means = torch.tensor([[0.05, -0.03, 2.5]], dtype=F64, requires_grad=True)
    scales = torch.tensor([[1.0, 0.8, 0.9]], dtype=F64)
    quat = torch.randn(1, 4, generator=gen, dtype=F64)
    op, color = torch.tensor([0.7], dtype=F64), torch.tensor([[0.2, 0.5, 0.9]], dtype=F64)
    res = rasterize(
        means,
        scales,
        quat,
        op,
        colors=color,
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(10.0, 10.0, 5.0, 4.0),
        width=10,
        height=8,
    )
    wgt = torch.rand(3, 8, 10, generator=gen, dtype=F64)
    (res.image * wgt).sum().backward()
    each = footprint_alphas(res, op, 10, 8)
    assert float(each.min()) > 2 / 255 and float(each.max()) < 0.98

    m2d = res.means2d.detach().clone().requires_grad_()
    a, b, c = res.conics.detach()[0]
    ys, xs = torch.meshgrid(
        torch.arange(8, dtype=F64) + 0.5, torch.arange(10, dtype=F64) + 0.5, indexing="ij"
    )
    dx, dy = m2d[0, 0] - xs, m2d[0, 1] - ys
    alpha = 0.7 * torch.exp(-0.5 * (a * dx * dx + c * dy * dy) - b * dx * dy)
    image = color[0][:, None, None] * alpha
    (want,) = torch.autograd.grad((image * wgt).sum(), m2d)
    torch.testing.assert_close(res.means2d.grad, want, rtol=1e-12, atol=1e-14)


def test_float32_inputs_get_float32_gradients(gen: torch.Generator) -> None:
    means = torch.tensor([[0.0, 0.1, 2.0], [0.1, 0.0, 3.0]], requires_grad=True)
    res = rasterize(
        means,
        torch.full((2, 3), 0.2),
        torch.randn(2, 4, generator=gen),
        torch.tensor([0.5, 0.9]),
        colors=torch.rand(2, 3, generator=gen),
        viewmat=torch.eye(4),
        K=intrinsics(10.0, 10.0, 5.0, 5.0).float(),
        width=10,
        height=10,
    )
    assert res.image.dtype == F64
    res.image.sum().backward()
    assert means.grad is not None and means.grad.dtype == torch.float32
    assert means.grad.abs().sum() > 0


def test_max_bytes_catches_double_activation(gen: torch.Generator) -> None:
    """Double activation: log-scales around -5 activated twice become ~1, every Gaussian
    covers every tile, and the binning buffer explodes; max_bytes turns that into a clear
    error."""
    n = 200
    means = torch.cat(
        [torch.rand(n, 2, generator=gen, dtype=F64) * 2 - 1, torch.full((n, 1), 4.0, dtype=F64)],
        dim=1,
    )
    log_scales = -5 + 0.3 * torch.randn(n, 3, generator=gen, dtype=F64)
    kw = dict(
        colors=torch.rand(n, 3, dtype=F64),
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(100.0, 100.0, 32.0, 32.0),
        width=64,
        height=64,
        max_bytes=40_000,
    )
    args = (identity_quats(n), torch.full((n,), 0.5, dtype=F64))
    ok = rasterize(means, log_scales.exp(), *args, **kw)
    assert ok.n_intersections * 24 <= 40_000
    with pytest.raises(BudgetExceeded, match=r"touch \d+ tiles.*activated twice"):
        rasterize(means, log_scales.exp().exp(), *args, **kw)


def _good(n: int = 2) -> dict:
    return dict(
        means=torch.zeros(n, 3, dtype=F64) + torch.tensor([0.0, 0.0, 2.0], dtype=F64),
        scales=torch.full((n, 3), 0.1, dtype=F64),
        rotations=identity_quats(n),
        opacities=torch.full((n,), 0.5, dtype=F64),
        colors=torch.rand(n, 3, dtype=F64),
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(5.0, 5.0, 2.0, 2.0),
        width=4,
        height=4,
    )


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (
            dict(means=torch.zeros(2, 4, dtype=F64)),
            ValueError,
            r"means must be \[N, 3\], got \[2, 4\]",
        ),
        (
            dict(scales=torch.zeros(3, 3, dtype=F64)),
            ValueError,
            r"scales must be \[2, 3\], got \[3",
        ),
        (dict(opacities=torch.ones(2, 1, dtype=F64)), ValueError, r"opacities must be \[2\]"),
        (
            dict(scales=torch.full((2, 3), -5.0, dtype=F64)),
            ValueError,
            "log-scales from a checkpoint need exp",
        ),
        (dict(opacities=torch.tensor([-2.0, 3.0], dtype=F64)), ValueError, "sigmoid of the logits"),
        (dict(rotations=torch.zeros(2, 4, dtype=F64)), ValueError, "all-zero quaternion"),
        (dict(means=torch.full((2, 3), math.nan, dtype=F64)), ValueError, "means holds 6 NaN/inf"),
        (dict(means=torch.zeros(2, 3, dtype=torch.int64)), TypeError, "floating point"),
        (dict(means=[[0.0, 0.0, 1.0]]), TypeError, "must be a torch.Tensor, got list"),
        (
            dict(
                viewmat=torch.tensor(
                    [[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [1, 2, 3, 1]], dtype=F64
                )
            ),
            ValueError,
            "stored transposed",
        ),
        (dict(K=torch.eye(3, dtype=F64) * -1), ValueError, "fx, fy > 0"),
        (dict(width=0), ValueError, "width must be a positive int, got 0"),
        (dict(height=2.5), ValueError, "height must be a positive int"),
        (dict(sh=torch.zeros(2, 4, 3, dtype=F64)), ValueError, "exactly one of colors"),
        (dict(colors=None, sh=torch.zeros(2, 5, 3, dtype=F64)), ValueError, r"\(d \+ 1\)\^2"),
        (
            dict(colors=None, sh=torch.zeros(2, 4, 3, dtype=F64), sh_degree=2),
            ValueError,
            "needs 9 coefficients",
        ),
        (dict(sh_degree=1), ValueError, "only applies with sh"),
        (dict(background=torch.zeros(4, dtype=F64)), ValueError, r"background must be \[3\]"),
        (dict(max_bytes=-1), ValueError, "max_bytes must be None or an int"),
    ],
)
def test_bad_inputs(change: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        rasterize(**(_good() | change))


def _cloud(n: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    means = torch.cat(
        [
            torch.rand(n, 2, generator=gen, dtype=F64) * 2 - 1,
            3 + torch.rand(n, 1, generator=gen, dtype=F64),
        ],
        dim=1,
    )
    return (
        means,
        0.01 + 0.08 * torch.rand(n, 3, generator=gen, dtype=F64),
        torch.randn(n, 4, generator=gen, dtype=F64),
        torch.rand(n, generator=gen, dtype=F64),
        0.3 * torch.randn(n, 16, 3, generator=gen, dtype=F64),
    )


def test_row_chunking_does_not_change_results(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    means, scales, quats, op, sh = _cloud(150, gen)
    kw = dict(
        sh=sh,
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(40.0, 40.0, 20.0, 17.0),
        width=40,
        height=35,
    )
    whole = rasterize(means, scales, quats, op, **kw)
    monkeypatch.setattr(splat, "_CHUNK_ELEMENTS", 1)  # one pixel row at a time
    rows = rasterize(means, scales, quats, op, **kw)
    assert whole.n_intersections > 150
    for a, b in zip(whole[:3], rows[:3], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15)


def test_full_size_scene_forward_and_backward(gen: torch.Generator) -> None:
    """The documented scale: 2,000 Gaussians at 64×64, every gradient finite."""
    inputs = tuple(t.requires_grad_() for t in _cloud(2000, gen))
    res = rasterize(
        *inputs[:4],
        sh=inputs[4],
        viewmat=torch.eye(4, dtype=F64),
        K=intrinsics(64.0, 64.0, 32.0, 32.0),
        width=64,
        height=64,
    )
    (res.image.sum() + res.depth.sum()).backward()
    assert int((res.radii > 0).sum()) > 1500 and float(res.alpha.detach().max()) > 0.99
    assert res.means2d.grad is not None and bool(torch.isfinite(res.means2d.grad).all())
    for t in inputs:
        assert t.grad is not None and bool(torch.isfinite(t.grad).all())
        assert float(t.grad.abs().sum()) > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_are_upcast(dtype: torch.dtype) -> None:
    """The oracle takes 16-bit parameters as they are (the CUDA op's half-precision
    suites feed it those): everything is computed in float64 on their exact values, and the
    gradients come back in each leaf's dtype, the float64 ones rounded once."""
    gen = torch.Generator().manual_seed(29)
    n = 12
    z = 2 + 3 * torch.rand(n, generator=gen, dtype=F64)
    means = torch.stack(
        [
            (torch.rand(n, generator=gen, dtype=F64) - 0.5) * z,
            (torch.rand(n, generator=gen, dtype=F64) - 0.5) * z,
            z,
        ],
        1,
    )
    params = {
        "means": means,
        "scales": torch.exp(-2 - torch.rand(n, 3, generator=gen, dtype=F64)),
        "rotations": torch.randn(n, 4, generator=gen, dtype=F64),
        "opacities": 0.2 + 0.7 * torch.rand(n, generator=gen, dtype=F64),
        "sh": 0.3 * torch.randn(n, 4, 3, generator=gen, dtype=F64),
        "background": torch.rand(3, generator=gen, dtype=F64),
    }
    camera = {
        "viewmat": torch.eye(4, dtype=torch.float32),
        "K": torch.tensor([[30.0, 0, 16], [0, 30.0, 12], [0, 0, 1]]),
        "width": 32,
        "height": 24,
    }
    half = {k: v.to(dtype).requires_grad_() for k, v in params.items()}
    exact = {k: v.detach().double().requires_grad_() for k, v in half.items()}
    weights = torch.randn(3, 24, 32, generator=gen, dtype=F64)
    got, want = rasterize(**half, **camera), rasterize(**exact, **camera)
    assert got.image.dtype == F64 and int(got.radii.gt(0).sum()) >= 6
    for name in ("image", "alpha", "depth", "means2d", "conics", "colors"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    (got.image * weights).sum().backward()
    (want.image * weights).sum().backward()
    for name, leaf in half.items():
        assert leaf.grad is not None and leaf.grad.dtype == dtype, name
        g64 = exact[name].grad
        assert g64 is not None and bool(g64.abs().sum() > 0), name
        assert torch.equal(leaf.grad, g64.to(dtype)), name
