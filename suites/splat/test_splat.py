"""GPU suite of ``gpucheck.ops.rasterize`` (forward), the CUDA Gaussian-splatting rasterizer;
its gradients are tested in test_splat_backward.py.

Every test runs on each target device with *another* device current (``gpu_device``), so a
missing device guard crashes or renders on the wrong GPU. The oracle is
``gpucheck.reference.rasterize`` on CPU in float64, fed the same float32 values. Scenes are
fresh random ones each run; the seed is in every failure message.

Tolerances. The kernel preprocesses every Gaussian in float64 like the reference, so radii
(and the tile rectangles behind ``n_intersections``: the 3-sigma square intersected with the
opacity-aware box) must be *equal*. Compositing is float32:
each Gaussian's pixel mean and conic are rounded to float32 (relative 6e-8: at pixel
coordinates up to ~200 that moves dx by up to ~1e-5 px, which moves the exponent by
|a dx + b dy| * 1e-5 <= ~6e-5 for the sharpest Gaussian that still reaches alpha >= 1/255,
i.e. a relative error of ~6e-5 in its alpha; in practice dx errors are far smaller), the
exponent's own rounding (with fmas) ~4e-6 of alpha for round Gaussians, ``ex2`` (for ``exp``)
2 ulp, and the colour, transmittance and depth sums round once per Gaussian. Colours are
<= ~2, so image and alpha must agree to ``ATOL = 1e-4`` and the accumulated depth
``depth * alpha`` to ``ATOL * z_max``.
On top of that the kernel may decide a threshold the other way from the reference when a value
lies within that error of it (``alpha >= 1/255``, ``T (1 - alpha) >= 1e-4``): one such flip
changes a pixel by at most 2 / 255 of the largest colour (skip) or 1e-2 (stop). So at most
``max(2, pixels / 1000)`` pixels may exceed ``ATOL``, and none by more than
``FLIP_ATOL = 0.02 * max(1, largest colour or background)``.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import splat_scenes
import torch

import gpucheck.kernels.splat.reference as reference_splat
from gpucheck.errors import BudgetExceeded, MemoryAnomalyError
from gpucheck.kernels.splat.op import ops
from gpucheck.ops import rasterize
from gpucheck.reference import rasterize as reference

pytestmark = [pytest.mark.gpu, pytest.mark.gpucheck_kernels]

# measured (benchmarks/splat_tolerances.py, 2026-11-26, the random scenes of this suite, ~700
# fresh seeds on an H100 and an H200): at most 2 pixels beyond ATOL (a flipped decision; the
# bound is max(2, 0.1 %) of the values, 68 at 113x203), largest error 3.1e-3 (FLIP_ATOL 0.02);
# the other values ~2e-6 (image, alpha), ~1e-5 (depth * alpha)
ATOL = 1e-4
FLIP_SHARE = 1e-3


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _flip_bound(args: dict[str, Any], ref: Any) -> float:
    largest = max(
        1.0,
        float(ref.colors.abs().max()) if ref.colors.numel() else 0.0,
        float(args["background"].abs().max()) if args.get("background") is not None else 0.0,
    )
    return 0.02 * largest


def _close(got: torch.Tensor, want: torch.Tensor, atol: float, flip: float, what: str) -> None:
    err = (got.double().cpu() - want).abs()
    assert bool(torch.isfinite(got).all()), f"{what}: non-finite values"
    over = int((err > atol).sum())
    allowed = max(2, int(FLIP_SHARE * err.numel()))
    assert over <= allowed, f"{what}: {over} values beyond atol {atol} (allowed {allowed})"
    worst = float(err.max()) if err.numel() else 0.0
    assert worst <= flip, f"{what}: max error {worst:.3g} > {flip:.3g}"


def check_against_reference(args: dict[str, Any], what: str) -> Any:
    """Render ``args`` (float32, on a CUDA device) with the kernel and the reference."""
    got = rasterize(**args)
    dev = args["means"].device
    h, w = args["height"], args["width"]
    assert got.image.shape == (3, h, w) and got.image.dtype == torch.float32
    assert got.alpha.shape == (h, w) and got.depth.shape == (h, w)
    assert got.radii.dtype == torch.int32
    assert {t.device for t in (got.image, got.alpha, got.depth, got.radii)} == {dev}
    ref = reference(**splat_scenes.to(args, "cpu"))
    assert torch.equal(got.radii.cpu(), ref.radii), f"{what}: radii differ"
    assert got.n_intersections == ref.n_intersections, f"{what}: n_intersections differ"
    # per-Gaussian outputs: float64 preprocessing rounded once to float32
    assert torch.equal(got.tiles.cpu(), ref.tiles), f"{what}: tile rectangles differ"
    torch.testing.assert_close(
        got.means2d.detach().cpu().double(),
        ref.means2d.detach(),
        rtol=1e-6,
        atol=1e-4,
        msg=lambda m: f"{what}: means2d: {m}",
    )
    torch.testing.assert_close(
        got.depths.cpu().double(),
        ref.depths,
        rtol=1e-6,
        atol=1e-6,
        msg=lambda m: f"{what}: depths: {m}",
    )
    torch.testing.assert_close(
        got.colors.cpu().double(),
        ref.colors,
        rtol=1e-6,
        atol=1e-6,
        msg=lambda m: f"{what}: colors: {m}",
    )
    vis = ref.radii > 0
    if bool(vis.any()):
        want = ref.conics[vis].detach()
        torch.testing.assert_close(
            got.conics.cpu().double()[vis],
            want,
            rtol=1e-5,
            atol=1e-6 * float(want.abs().max()),
            msg=lambda m: f"{what}: conics: {m}",
        )
    assert not bool(got.conics[~vis.to(got.conics.device)].any()), f"{what}: culled conics"
    flip = _flip_bound(args, ref)
    _close(got.image, ref.image, ATOL, flip, f"{what}: image")
    _close(got.alpha, ref.alpha, ATOL, flip, f"{what}: alpha")
    visible_z = ref.depths[ref.radii > 0]
    z_max = max(1.0, float(visible_z.max()) if visible_z.numel() else 0.0)
    _close(
        got.depth * got.alpha,
        ref.depth * ref.alpha,
        ATOL * z_max,
        flip * z_max,
        f"{what}: depth * alpha",
    )
    assert bool((got.depth[got.alpha == 0] == 0).all()), f"{what}: depth where alpha is 0"
    return got


# (height, width, N): 1x1, one tile, not tile multiples, the 113x203.
SIZES = [(1, 1, 5), (16, 16, 40), (17, 33, 60), (113, 203, 300)]


@pytest.mark.sanitizer
@pytest.mark.parametrize(
    ("height", "width", "n"), SIZES, ids=[f"{h}x{w}-N{n}" for h, w, n in SIZES]
)
def test_matches_reference_rgb(gpu_device: torch.device, height: int, width: int, n: int) -> None:
    seed = fresh_seed()
    args = splat_scenes.scene(n, width, height, seed, gpu_device)
    check_against_reference(args, f"rgb {height}x{width} N={n} seed={seed}")


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_matches_reference_sh(gpu_device: torch.device, degree: int) -> None:
    seed = fresh_seed()
    args = splat_scenes.scene(300, 203, 113, seed, gpu_device, sh_degree=degree)
    check_against_reference(args, f"sh{degree} 113x203 seed={seed}")


@pytest.mark.sanitizer
def test_sh_degree_lower_than_stored(gpu_device: torch.device) -> None:
    seed = fresh_seed()
    args = splat_scenes.scene(80, 40, 30, seed, gpu_device, sh_degree=3)
    args["sh_degree"] = 1
    check_against_reference(args, f"sh3 evaluated at degree 1 seed={seed}")


def test_dense_scene(gpu_device: torch.device) -> None:
    """Many overlapping Gaussians: most pixels stop on the transmittance threshold, and tiles
    hold more Gaussians than one shared-memory batch (256)."""
    seed = fresh_seed()
    args = splat_scenes.scene(1500, 64, 48, seed, gpu_device, log_scale=(-2.5, -1.0))
    got = check_against_reference(args, f"dense seed={seed}")
    assert float(got.alpha.mean()) > 0.9


def test_one_gaussian(gpu_device: torch.device) -> None:
    seed = fresh_seed()
    args = splat_scenes.scene(1, 203, 113, seed, gpu_device, spread=0.2, log_scale=(-2, -1))
    got = check_against_reference(args, f"N=1 seed={seed}")
    assert int(got.radii[0]) > 0


@pytest.mark.sanitizer
def test_no_gaussians(gpu_device: torch.device) -> None:
    args = splat_scenes.scene(0, 203, 113, fresh_seed(), gpu_device)
    got = check_against_reference(args, "N=0")
    bg = args["background"]
    assert torch.equal(got.image, bg[:, None, None].expand(3, 113, 203))
    assert not bool(got.alpha.any()) and not bool(got.depth.any())
    assert got.radii.shape == (0,) and got.n_intersections == 0


@pytest.mark.sanitizer
def test_behind_the_camera(gpu_device: torch.device) -> None:
    """Camera depths from -3 to 0.2 (the near plane itself included) are culled."""
    seed = fresh_seed()
    args = splat_scenes.scene(50, 64, 48, seed, gpu_device, depth_range=(-3.0, 0.2))
    got = check_against_reference(args, f"behind seed={seed}")
    assert not bool(got.radii.any())
    assert torch.equal(got.image, args["background"][:, None, None].expand(3, 48, 64))


@pytest.mark.sanitizer
def test_near_plane_straddle(gpu_device: torch.device) -> None:
    seed = fresh_seed()
    args = splat_scenes.scene(200, 64, 48, seed, gpu_device, depth_range=(-0.5, 1.5))
    check_against_reference(args, f"near plane seed={seed}")


@pytest.mark.sanitizer
def test_huge_gaussians(gpu_device: torch.device) -> None:
    """Scales of 1-5 at depth 1-6: every Gaussian covers the whole image."""
    seed = fresh_seed()
    args = splat_scenes.scene(20, 203, 113, seed, gpu_device, log_scale=(0.0, 1.6))
    got = check_against_reference(args, f"huge seed={seed}")
    tiles = math.ceil(203 / 16) * math.ceil(113 / 16)
    assert got.n_intersections >= tiles


@pytest.mark.sanitizer
def test_tiny_gaussians(gpu_device: torch.device) -> None:
    """Scales of 1e-6-1e-4: only the 0.3 px low-pass is left (radius 3 px)."""
    seed = fresh_seed()
    args = splat_scenes.scene(300, 203, 113, seed, gpu_device, log_scale=(-13.8, -9.2))
    got = check_against_reference(args, f"tiny seed={seed}")
    visible = got.radii[got.radii > 0]
    assert visible.numel() > 0 and int(visible.max()) <= 3


def test_opacity_aware_tiles(gpu_device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opacities from 0 to 1 (about a sixth below 1/255) and a third of the Gaussians thin:
    the kernel bins each one into the tiles of its opacity-aware box, as the reference does
    (equal rectangles, some visible Gaussians touching none), and renders what the reference
    renders when it bins whole 3-sigma squares (the rule before the box): the dropped tiles
    held no pixel with alpha >= 1/255."""
    seed = fresh_seed()
    args = splat_scenes.scene(400, 203, 113, seed, gpu_device, log_scale=(-4.5, -1.0))
    gen = torch.Generator().manual_seed(seed)
    args["opacities"] = (torch.rand(400, generator=gen) ** 3).to(gpu_device)
    args["scales"][::3, 1:] *= 1e-2
    what = f"opacity-aware seed={seed}"
    got = check_against_reference(args, what)
    empty = (got.radii > 0) & (got.tiles[:, 2] == got.tiles[:, 0])
    assert bool(empty.any()), f"{what}: no visible Gaussian without tiles"
    monkeypatch.setattr(
        reference_splat,
        "_tile_box",
        lambda sxx, syy, det, m, o: (
            torch.full_like(m, math.inf),
            torch.ones_like(o, dtype=torch.bool),
        ),
    )
    square = reference(**splat_scenes.to(args, "cpu"))
    assert got.n_intersections < square.n_intersections, what
    flip = _flip_bound(args, square)
    _close(got.image, square.image, ATOL, flip, f"{what}: image vs squares")
    _close(got.alpha, square.alpha, ATOL, flip, f"{what}: alpha vs squares")


@pytest.mark.sanitizer
def test_off_screen(gpu_device: torch.device) -> None:
    """Means up to 4x the half field of view to the sides: most culled, the Jacobian clamp
    applies to those whose footprint still reaches the image."""
    seed = fresh_seed()
    args = splat_scenes.scene(1000, 64, 48, seed, gpu_device, spread=8.0, log_scale=(-3.0, -1.0))
    got = check_against_reference(args, f"off-screen seed={seed}")
    assert 0 < int((got.radii > 0).sum()) < 1000


@pytest.mark.sanitizer
def test_equal_depths_keep_index_order(gpu_device: torch.device) -> None:
    """Gaussians at exactly the same depth composite in index order (a stable sort)."""
    n = 40
    gen = torch.Generator().manual_seed(fresh_seed())
    means = torch.cat([torch.rand(n, 2, generator=gen) * 0.4 - 0.2, torch.full((n, 1), 2.0)], 1)
    args = dict(
        means=means,
        scales=torch.full((n, 3), 0.15),
        rotations=torch.randn(n, 4, generator=gen),
        opacities=torch.full((n,), 0.6),
        colors=torch.rand(n, 3, generator=gen),
        viewmat=torch.eye(4),
        K=torch.tensor([[40.0, 0, 20], [0, 40.0, 16], [0, 0, 1]]),
        width=40,
        height=32,
        background=torch.rand(3, generator=gen),
    )
    check_against_reference(splat_scenes.to(args, gpu_device), "equal depths")


@pytest.mark.sanitizer
def test_bitwise_repeatable(gpu_device: torch.device) -> None:
    args = splat_scenes.scene(3000, 256, 200, fresh_seed(), gpu_device, sh_degree=3)
    first = rasterize(**args)
    for _ in range(4):
        again = rasterize(**args)
        for name in ("image", "alpha", "depth", "radii"):
            assert torch.equal(getattr(again, name), getattr(first, name)), name


@pytest.mark.multigpu
def test_bitwise_across_devices(
    gpu_device: torch.device, other_device: torch.device | None
) -> None:
    if other_device is None:
        pytest.skip("needs a second visible CUDA device")
    args = splat_scenes.scene(3000, 256, 200, fresh_seed(), gpu_device, sh_degree=2)
    here = rasterize(**args)
    there = rasterize(**splat_scenes.to(args, other_device))
    assert there.image.device == other_device
    assert torch.equal(here.image, there.image.to(gpu_device))
    assert torch.equal(here.radii, there.radii.to(gpu_device))


@pytest.mark.sanitizer
def test_current_device_and_stream(
    gpu_device: torch.device, other_device: torch.device | None
) -> None:
    before = torch.cuda.current_device()
    if other_device is not None:
        assert before == other_device.index  # the fixture made another device current
    args = splat_scenes.scene(500, 64, 48, fresh_seed(), gpu_device)
    want = rasterize(**args)
    assert torch.cuda.current_device() == before
    stream = torch.cuda.Stream(device=gpu_device)
    stream.wait_stream(torch.cuda.current_stream(gpu_device))
    with torch.cuda.stream(stream):
        got = rasterize(**args)
    stream.synchronize()
    assert torch.equal(got.image, want.image)
    assert torch.empty(1, device="cuda").device.index == before


def _double_activated(
    n: int, width: int, height: int, f: float, device: torch.device, twice: bool
) -> dict[str, Any]:
    """Story 3: log-scales around -5, activated once (fine) or twice (~1: enormous)."""
    gen = torch.Generator().manual_seed(fresh_seed())
    means = torch.cat([torch.rand(n, 2, generator=gen) * 2 - 1, torch.full((n, 1), 4.0)], 1)
    scales = torch.exp(-5 + 0.3 * torch.randn(n, 3, generator=gen))
    if twice:
        scales = scales.exp()
    args = dict(
        means=means,
        scales=scales,
        rotations=torch.randn(n, 4, generator=gen),
        opacities=torch.rand(n, generator=gen),
        colors=torch.rand(n, 3, generator=gen),
        viewmat=torch.eye(4),
        K=torch.tensor([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]]),
        width=width,
        height=height,
    )
    return splat_scenes.to(args, device)


@pytest.mark.sanitizer
def test_max_bytes_catches_double_activation(gpu_device: torch.device) -> None:
    ok = _double_activated(200, 64, 64, 100.0, gpu_device, twice=False)
    got = rasterize(**ok, max_bytes=40_000)
    assert got.n_intersections * 24 <= 40_000
    bad = _double_activated(200, 64, 64, 100.0, gpu_device, twice=True)
    pattern = (
        r"binning budget exceeded: more than max_bytes 40000\. 200 Gaussians "
        r"\(\d+ visible\) touch \d+ tiles in total .*binning needs \d+ bytes, \d+ bytes "
        r"free; radius percentiles .*p50 \d+, p90 \d+, p99 \d+, max \d+; \d+ Gaussians .* "
        r"cover more than 25 % of the image\. Hint: .*activation applied twice"
    )
    with pytest.raises(MemoryAnomalyError, match=pattern) as info:
        rasterize(**bad, max_bytes=40_000)
    err = info.value
    assert isinstance(err, BudgetExceeded)
    assert err.n == 200 and err.visible is not None and 0 < err.visible <= 200
    assert err.overlaps is not None and err.bytes_needed == 24 * err.overlaps > 40_000
    assert err.bytes_free is not None and err.bytes_free > 0
    assert err.radius_percentiles is not None and err.radius_percentiles["p50"] > 32
    assert err.large_share is not None and err.large_share > 0.5
    assert err.hint is not None and "activation applied twice" in err.hint
    with pytest.raises(BudgetExceeded):  # the oracle agrees
        reference(**splat_scenes.to(bad, "cpu"), max_bytes=40_000)
    # nothing broken afterwards
    assert rasterize(**ok).n_intersections == got.n_intersections


def test_free_memory_catches_double_activation(gpu_device: torch.device) -> None:
    """4M Gaussians activated twice at 1920x1080 each cover most of the 8160 tiles (~6200 in
    their opacity-aware boxes): ~2.5e10 overlaps, ~300 GB of binning buffers at 12 bytes a
    pair, more than any GPU has (2M, 150 GB, came within the free memory of an H200); the
    error comes before any of it is allocated."""
    n = 4_000_000
    bad = _double_activated(n, 1920, 1080, 1000.0, gpu_device, twice=True)
    torch.cuda.reset_peak_memory_stats(gpu_device)
    base = torch.cuda.memory_allocated(gpu_device)
    with pytest.raises(
        MemoryAnomalyError, match=r"bytes free on cuda:\d.*activation applied twice"
    ) as info:
        rasterize(**bad)
    assert info.value.n == n and (info.value.overlaps or 0) > 2e10  # ~6200 each
    assert info.value.bytes_needed is not None and info.value.bytes_free is not None
    assert info.value.bytes_needed > info.value.bytes_free
    # per-Gaussian buffers only (~110 bytes each), never the binning buffers
    assert torch.cuda.max_memory_allocated(gpu_device) - base < 400 * n


@pytest.mark.sanitizer
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_opcheck(gpu_device: torch.device, dtype: str) -> None:
    for degree in (None, 2):
        a = splat_scenes.scene(60, 37, 21, fresh_seed(), gpu_device, sh_degree=degree)
        a = splat_scenes.to(a, gpu_device, getattr(torch, dtype))
        values = a["colors"] if degree is None else a["sh"]
        torch.library.opcheck(
            ops().project,
            (
                a["means"],
                a["scales"],
                a["rotations"],
                a["opacities"],
                values,
                a["viewmat"],
                a["K"],
                a["background"],
                a["width"],
                a["height"],
                -1 if degree is None else degree,
                None,
            ),
        )


HALF = [torch.bfloat16, torch.float16]


@pytest.mark.sanitizer
@pytest.mark.parametrize("dtype", HALF, ids=["bfloat16", "float16"])
@pytest.mark.parametrize("degree", [None, 3], ids=["rgb", "sh3"])
def test_half_parameters_render_as_their_float32_values(
    gpu_device: torch.device, dtype: torch.dtype, degree: int | None
) -> None:
    """16-bit parameters are read as such and computed on exactly as float32 ones: the same
    values (a half scene, and the same scene converted to float32, which is exact) give the
    same bits in every output, all of them float32 (int32)."""
    seed = fresh_seed()
    half = splat_scenes.to(
        splat_scenes.scene(300, 203, 113, seed, gpu_device, sh_degree=degree), gpu_device, dtype
    )
    got = rasterize(**half)
    want = rasterize(**splat_scenes.to(half, gpu_device))
    what = f"{dtype} sh={degree} seed={seed}"
    assert got.n_intersections == want.n_intersections > 0, what
    for name in (
        "image",
        "alpha",
        "depth",
        "means2d",
        "depths",
        "conics",
        "colors",
        "radii",
        "tiles",
    ):
        g, w = getattr(got, name), getattr(want, name)
        assert g.dtype == w.dtype and g.dtype in (torch.float32, torch.int32), (what, name)
        assert torch.equal(g, w), f"{what}: {name} differs from the float32 render"


@pytest.mark.parametrize("dtype", HALF, ids=["bfloat16", "float16"])
@pytest.mark.parametrize(
    ("height", "width", "n", "degree"),
    [(113, 203, 300, None), (113, 203, 300, 3), (48, 64, 1500, None)],
    ids=["rgb", "sh3", "dense"],
)
def test_half_matches_reference(
    gpu_device: torch.device,
    dtype: torch.dtype,
    height: int,
    width: int,
    n: int,
    degree: int | None,
) -> None:
    """Against the float64 reference fed the same (16-bit) values, with float32's tolerances:
    the kernel computes on them as on float32 ones. Measured (benchmarks/splat_tolerances.py
    --dtype, H200, 2026-11-26, these scenes, ~155 a dtype): radii equal, at most 3 values (1
    pixel) beyond ATOL, largest error bfloat16 3.0e-3, float16 3.2e-3 (float32: 3, 3.1e-3)."""
    seed = fresh_seed()
    args = splat_scenes.to(
        splat_scenes.scene(n, width, height, seed, gpu_device, sh_degree=degree), gpu_device, dtype
    )
    check_against_reference(args, f"{dtype} {height}x{width} N={n} sh={degree} seed={seed}")


def _good(d: torch.device, n: int = 5, **change: Any) -> dict[str, Any]:
    args = splat_scenes.scene(n, 32, 24, 7, d)
    args.update(change)
    return args


def _edit(d: torch.device, name: str, fn: Any) -> dict[str, Any]:
    args = _good(d)
    args[name] = fn(args[name].clone())
    return args


def _set(t: torch.Tensor, index: Any, value: float) -> torch.Tensor:
    t[index] = value
    return t


def _half(d: torch.device, dtype: torch.dtype, **dtypes: torch.dtype) -> dict[str, Any]:
    """_good with its parameters in ``dtype`` (the camera float32), then the tensors named in
    ``dtypes`` in those."""
    args = splat_scenes.to(_good(d), d, dtype)
    return {k: (v.to(dtypes[k]) if k in dtypes else v) for k, v in args.items()}


def _set_in(args: dict[str, Any], name: str, index: Any, value: float) -> dict[str, Any]:
    args[name] = _set(args[name].clone(), index, value)
    return args


BAD_INPUTS = [
    # (id, make(device) -> kwargs, exception, message pattern)
    (
        "means_shape",
        lambda d: _good(d, means=torch.rand(5, 4, device=d)),
        ValueError,
        r"means must be \[N, 3\], got \[5, 4\]",
    ),
    (
        "scales_n",
        lambda d: _good(d, scales=torch.rand(4, 3, device=d) + 0.1),
        ValueError,
        r"scales must be \[5, 3\], got \[4, 3\]",
    ),
    (
        "opacities_shape",
        lambda d: _good(d, opacities=torch.rand(5, 1, device=d)),
        ValueError,
        r"opacities must be \[5\], got \[5, 1\]",
    ),
    (
        "float64",
        lambda d: _edit(d, "means", lambda t: t.double()),
        TypeError,
        r"means must be float32, bfloat16 or float16 \(the Gaussian parameters' dtype\), got "
        r"torch.float64",
    ),
    (
        "float16_mix",
        lambda d: _edit(d, "opacities", lambda t: t.half()),
        TypeError,
        r"must share one dtype \(float32, bfloat16 or float16\): means is torch.float32 but "
        r"opacities is torch.float16",
    ),
    (
        "bfloat16_sh_mix",
        lambda d: _good(d, colors=None, sh=torch.rand(5, 4, 3, device=d, dtype=torch.bfloat16)),
        TypeError,
        r"means is torch.float32 but sh is torch.bfloat16",
    ),
    (
        "bfloat16_mix",
        lambda d: _half(d, torch.bfloat16, scales=torch.float32, background=torch.float16),
        TypeError,
        r"means is torch.bfloat16 but scales is torch.float32, background is torch.float16",
    ),
    (
        "bfloat16_viewmat",
        lambda d: _half(d, torch.bfloat16, viewmat=torch.bfloat16),
        TypeError,
        r"viewmat must be float32 \(the camera stays float32 whatever the Gaussian parameters' "
        r"dtype\), got torch.bfloat16",
    ),
    (
        "float16_K",
        lambda d: _half(d, torch.float16, K=torch.float16),
        TypeError,
        r"K must be float32 \(the camera stays float32",
    ),
    (
        "nan_bfloat16",
        lambda d: _set_in(_half(d, torch.bfloat16), "means", (3, 2), math.nan),
        ValueError,
        r"inputs must be finite, but Gaussian 3 holds a NaN/inf: means \[.*nan\]",
    ),
    (
        "inf_float16_opacity",
        lambda d: _set_in(_half(d, torch.float16), "opacities", 1, math.inf),
        ValueError,
        r"Gaussian 1 holds a NaN/inf",
    ),
    (
        "float16_overflow_color",
        lambda d: _set_in(
            _half(d, torch.float16), "colors", (2, 0), 1e5
        ),  # 1e5 > 65504 rounds to inf
        ValueError,
        r"Gaussian 2 holds a NaN/inf",
    ),
    (
        "bfloat16_log_scales",
        lambda d: _set_in(_half(d, torch.bfloat16), "scales", (0, 1), -2.0),
        ValueError,
        r"scales must be positive .*for Gaussian 0",
    ),
    (
        "non_contiguous",
        lambda d: _good(d, rotations=torch.randn(4, 5, device=d).t()),
        ValueError,
        r"rotations must be contiguous, got strides \[1, 5\]",
    ),
    (
        "cpu",
        lambda d: _edit(d, "means", lambda t: t.cpu()),
        ValueError,
        r"means must be a CUDA tensor, got one on cpu",
    ),
    (
        "cpu_viewmat",
        lambda d: _edit(d, "viewmat", lambda t: t.cpu()),
        ValueError,
        r"viewmat must be a CUDA tensor, got one on cpu",
    ),
    (
        "not_tensor",
        lambda d: _good(d, K=[[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]]),
        TypeError,
        r"K must be a torch.Tensor, got list",
    ),
    (
        "log_scales",
        lambda d: _edit(d, "scales", lambda t: t.log()),
        ValueError,
        r"scales must be positive .*got \[.*\] for Gaussian 0: raw log-scales from a checkpoint "
        r"need exp first",
    ),
    (
        "opacity_logits",
        lambda d: _edit(d, "opacities", lambda t: _set(t, 3, 2.5)),
        ValueError,
        r"opacities must be in \[0, 1\] \(activated, sigmoid of the logits\), got \[2.5\] for "
        r"Gaussian 3",
    ),
    (
        "zero_quaternion",
        lambda d: _edit(d, "rotations", lambda t: _set(t, 2, 0.0)),
        ValueError,
        r"all-zero quaternion .*Gaussian 2",
    ),
    (
        "nan_mean",
        lambda d: _edit(d, "means", lambda t: _set(t, (4, 1), math.nan)),
        ValueError,
        r"inputs must be finite, but Gaussian 4 holds a NaN/inf",
    ),
    (
        "inf_color",
        lambda d: _edit(d, "colors", lambda t: _set(t, (1, 2), math.inf)),
        ValueError,
        r"Gaussian 1 holds a NaN/inf",
    ),
    (
        "transposed_viewmat",
        lambda d: _edit(d, "viewmat", lambda t: t.T.contiguous()),
        ValueError,
        r"bottom row \[0, 0, 0, 1\] \(3DGS's world_view_transform is stored "
        r"transposed\)",
    ),
    ("bad_K", lambda d: _edit(d, "K", lambda t: -t), ValueError, r"fx, fy > 0"),
    (
        "colors_and_sh",
        lambda d: _good(d, sh=torch.rand(5, 4, 3, device=d)),
        ValueError,
        r"exactly one of colors",
    ),
    (
        "sh_coeffs",
        lambda d: _good(d, colors=None, sh=torch.rand(5, 5, 3, device=d)),
        ValueError,
        r"\(d \+ 1\)\^2 coefficients",
    ),
    (
        "sh_degree_too_high",
        lambda d: _good(d, colors=None, sh=torch.rand(5, 4, 3, device=d), sh_degree=2),
        ValueError,
        r"sh_degree 2 needs 9 coefficients per channel, got sh of shape \[5, 4, 3\]",
    ),
    ("width_zero", lambda d: _good(d, width=0), ValueError, r"width must be a positive int"),
    ("height_float", lambda d: _good(d, height=24.0), TypeError, r"height must be an int"),
    (
        "max_bytes_negative",
        lambda d: _good(d, max_bytes=-1),
        ValueError,
        r"max_bytes must be None or >= 0",
    ),
]


@pytest.mark.sanitizer
@pytest.mark.parametrize(
    ("make", "exc", "pattern"), [b[1:] for b in BAD_INPUTS], ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input(gpu_device: torch.device, make: Any, exc: type[Exception], pattern: str) -> None:
    args = make(gpu_device)
    before = torch.cuda.current_device()
    with pytest.raises(exc, match=pattern):
        rasterize(**args)
    assert torch.cuda.current_device() == before
    # the error left no broken state behind
    assert rasterize(**_good(gpu_device)).image.shape == (3, 24, 32)


@pytest.mark.sanitizer
def test_cpp_checks_for_torch_ops_callers(gpu_device: torch.device) -> None:
    """torch.ops.gpucheck.splat_project callers skip the Python checks; the entry point's
    own ones still give clear errors."""
    a = _good(gpu_device)
    args = [
        a["means"],
        a["scales"],
        a["rotations"],
        a["opacities"],
        a["colors"],
        a["viewmat"],
        a["K"],
        a["background"],
        32,
        24,
        -1,
        None,
    ]
    bad_degree = list(args)
    bad_degree[10] = 4
    with pytest.raises(ValueError, match=r"sh_degree must be -1 .* or in 0..3, got 4"):
        ops().project(*bad_degree)
    big = list(args)
    big[8] = 70_000
    with pytest.raises(ValueError, match=r"width and height must be in \[1, 65536\]"):
        ops().project(*big)
    cpu_bg = list(args)
    cpu_bg[7] = a["background"].cpu()
    # common.h's check_cuda raises a plain RuntimeError (TORCH_CHECK)
    with pytest.raises(RuntimeError, match=r"background must be a CUDA tensor, got one on cpu"):
        ops().project(*cpu_bg)
    # dtypes: the parameters share means' dtype, the camera is float32
    h = splat_scenes.to(a, gpu_device, torch.bfloat16)
    half_args = [
        h["means"],
        h["scales"],
        h["rotations"],
        h["opacities"],
        h["colors"],
        h["viewmat"],
        h["K"],
        h["background"],
        32,
        24,
        -1,
        None,
    ]
    assert len(ops().project(*half_args)) == 10
    mixed = list(half_args)
    mixed[1] = a["scales"]
    with pytest.raises(
        TypeError,
        match=r"splat_project: scales must be bfloat16 like means "
        r"\(the Gaussian parameters .* share one dtype.*\), got Float",
    ):
        ops().project(*mixed)
    camera = list(half_args)
    camera[5] = h["viewmat"].to(torch.bfloat16)
    with pytest.raises(
        TypeError,
        match=r"splat_project: viewmat must be float32 \(the camera "
        r"stays float32 .*\), got BFloat16",
    ):
        ops().project(*camera)
    double = list(args)
    double[0] = a["means"].double()
    with pytest.raises(
        TypeError,
        match=r"splat_project: means must be float32, bfloat16 or "
        r"float16 \(the Gaussian parameters' dtype\), got Double",
    ):
        ops().project(*double)


@pytest.mark.multigpu
def test_inputs_on_two_devices(gpu_device: torch.device, other_device: torch.device | None) -> None:
    if other_device is None:
        pytest.skip("needs a second visible CUDA device")
    args = _edit(gpu_device, "opacities", lambda t: t.to(other_device))
    # common.h's check_same_device raises a plain RuntimeError (TORCH_CHECK), as check_cuda
    with pytest.raises(RuntimeError, match=r"opacities is on cuda:\d but means is on cuda:\d"):
        rasterize(**args)
