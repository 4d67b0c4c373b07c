"""GPU suite of the gradients of ``gpucheck.ops.rasterize`` against the float64 reference.

Every test runs on each target device with *another* device current (``gpu_device``). The
kernel gets float32 leaves on the GPU, the reference (``gpucheck.reference.rasterize``, CPU,
float64, autograd) the same values as float64 leaves; both take the same loss, a random
weighting of ``image``, ``alpha`` and ``depth`` (fresh weights every run; the seed is in every
failure message), and we compare the gradient of every leaf plus ``means2d.grad``, the
screen-space gradient of densification.

Tolerances, per gradient ``g`` against the reference's ``r`` (both [N, ...]):

* ``rel_l2 = ||g - r|| / ||r||`` must stay under ``REL_L2[name]``. The kernel composites in
  float32 (image errors ~2e-6, see test_splat.py) and its backward undoes the transmittance
  by division, Gaussian by Gaussian (relative error growing ~1e-7 per step over lists of up to
  a few hundred), and sums per-Gaussian gradients over up to 256 pixels a tile in float32.
  Measured over ~1400 random cases on an H100 and H200: at most 2.0e-5 (REL_L2 below); the
  bounds leave at least 4.9x headroom.
* The loss leaves out (weight 0) the few pixels that ``decision_pixels`` finds at a
  compositing decision: alpha within float32 rounding of 1/255 or of the 0.99 clamp, or the
  transmittance within rounding of the 1e-4 stop. There the gradient itself is discontinuous
  and float32 may take the other branch than float64: two Gaussians at 1/255 * (1 + 5e-7)
  put 3.3e-4 into the means gradient of a 200-Gaussian scene and, through the transmittance,
  1.1e-4 into the opacity gradient of another (``test_gradients_at_alpha_threshold``); the
  float64 reference moves as much when its inputs move by float32 rounding.
* The compositing order needs no window: the reference orders by float32 depth, ties by
  index, as the kernel's sort does (``compositing_order``); by float64 depth, two Gaussians
  one float32 depth apart changed places and with them which one the 1e-4 stop dropped
  (``test_gradients_at_depth_tie``).
* At most ``max(2, 1 %)`` of the Gaussians may differ by more than ``1e-3 * max|r|``, and
  none by more than ``FLIP * max|r|``: a safety net for a decision flip outside the windows
  of ``decision_pixels`` (which keep a 10x margin over the float32 errors); such a flip
  changes the gradients of the Gaussians of that pixel by up to about 2 % of the largest one.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import splat_scenes
import torch
from splat_grads import decision_pixels, errors, gradients

from gpucheck.kernels.splat.op import ops
from gpucheck.ops import rasterize
from gpucheck.reference import rasterize as reference

pytestmark = [pytest.mark.gpu, pytest.mark.gpucheck_kernels]

# measured (benchmarks/splat_tolerances.py, 2026-11-26: the scenes of this suite, fresh seeds,
# 405 gradient cases on an H100 and 380 on an H200 with the final build, 600 more on an H200
# with the build before; HISTORY.md "Tolerances from measurement"): largest relative L2
# scales 2.0e-5, rotations 1.5e-5, means 8.6e-6, background 6.9e-6, means2d 5.1e-6,
# opacities 1.2e-6, sh 1.1e-6, colors 8.6e-7; 1e-4 leaves at least 4.9x; largest element
# error 6.9e-5 of the largest gradient (FLIP: 0.05)
REL_L2 = {
    "means": 1e-4,
    "scales": 1e-4,
    "rotations": 1e-4,
    "opacities": 1e-4,
    "colors": 1e-4,
    "sh": 1e-4,
    "background": 1e-4,
    "means2d": 1e-4,
}
FLIP = 0.05  # times max |reference gradient|, for every element
# 16-bit parameters: their gradients are the float32 ones rounded once to the parameters' dtype,
# which alone moves each by up to u = 2^-8 (bfloat16) or 2^-11 (float16) of its size, so the
# relative L2 error is at most u plus float32's (REL_L2), whatever the scene; means2d's
# gradient stays float32 (REL_L2). Measured (benchmarks/splat_tolerances.py --dtype, H200,
# 2026-11-26, 72 rounds a dtype: 360 gradient cases of this suite's scenes): largest relative
# L2 bfloat16 3.4e-3 (background, 3 values), 3.0e-3 (scales), float16 4.7e-4 (background),
# 3.5e-4 (scales); means2d 5.0e-6 / 4.3e-6, as float32's. The bounds: u + 1e-4 with a
# quarter of slack (bfloat16 5e-3, 1.5x the largest measured) and 1e-3 for float16 (2.1x).
REL_L2_HALF = {torch.bfloat16: 5e-3, torch.float16: 1e-3}


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def check_gradients(
    args: dict[str, Any],
    what: str,
    extra: bool = False,
    seed: int | None = None,
    image_only: bool = False,
) -> dict[str, dict[str, float]]:
    """The kernel's gradients against the reference's; ``args``' parameters may be float32,
    bfloat16 or float16 (each gradient then in that dtype, means2d's float32)."""
    seed = fresh_seed() if seed is None else seed
    kernel, oracle = gradients(args, seed, extra, skip=decision_pixels(args), image_only=image_only)
    dtype = args["means"].dtype
    for name, g in kernel.items():
        assert g is not None, f"{what}: no gradient for {name}"
        want = torch.float32 if name == "means2d" else dtype
        assert g.device == args["means"].device and g.dtype == want, (name, g.dtype)
        assert bool(torch.isfinite(g).all()), f"{what}: non-finite gradient of {name}"
    found = errors(kernel, oracle)
    for name, e in found.items():
        label = f"{what} seed={seed} grad {name}: {e}"
        bound = (
            REL_L2[name] if dtype == torch.float32 or name == "means2d" else (REL_L2_HALF[dtype])
        )
        assert e["rel_l2"] <= bound, label
        assert e["max_rel"] <= FLIP, label
        n = kernel[name].shape[0] if kernel[name].dim() else 1
        assert e["share_over"] * n <= max(2, 0.01 * n), label
    return found


# (height, width, N): 1x1, one tile, not tile multiples, the 113x203.
SIZES = [(1, 1, 5), (16, 16, 40), (17, 33, 60), (113, 203, 300)]


@pytest.mark.parametrize(
    ("height", "width", "n"), SIZES, ids=[f"{h}x{w}-N{n}" for h, w, n in SIZES]
)
def test_gradients_rgb(gpu_device: torch.device, height: int, width: int, n: int) -> None:
    seed = fresh_seed()
    args = splat_scenes.scene(n, width, height, seed, gpu_device)
    check_gradients(args, f"rgb {height}x{width} N={n} scene={seed}")


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_gradients_sh(gpu_device: torch.device, degree: int) -> None:
    seed = fresh_seed()
    args = splat_scenes.scene(300, 203, 113, seed, gpu_device, sh_degree=degree)
    check_gradients(args, f"sh{degree} 113x203 scene={seed}")


def test_gradients_image_only_loss(gpu_device: torch.device) -> None:
    """A loss on the image alone (the photometric loss of training): alpha and depth get no
    gradient, and the render backward runs without their planes."""
    seed = fresh_seed()
    args = splat_scenes.scene(300, 203, 113, seed, gpu_device, sh_degree=3)
    check_gradients(args, f"image-only loss sh3 113x203 scene={seed}", image_only=True)


def test_gradients_sh_degree_lower_than_stored(gpu_device: torch.device) -> None:
    seed = fresh_seed()
    args = splat_scenes.scene(80, 40, 30, seed, gpu_device, sh_degree=3)
    args["sh_degree"] = 1
    check_gradients(args, f"sh3 at degree 1 scene={seed}")


def test_gradients_of_per_gaussian_outputs(gpu_device: torch.device) -> None:
    """Losses on means2d, depths and colors too, Gaussians behind the camera included."""
    seed = fresh_seed()
    args = splat_scenes.scene(200, 64, 48, seed, gpu_device, sh_degree=2, depth_range=(-0.5, 4.0))
    check_gradients(args, f"per-Gaussian outputs scene={seed}", extra=True)


EDGE_CASES = {
    # name: scene keyword arguments (n, width, height first)
    "dense": dict(n=1500, width=64, height=48, log_scale=(-2.5, -1.0)),
    "one": dict(n=1, width=203, height=113, spread=0.2, log_scale=(-2.0, -1.0)),
    "behind": dict(n=50, width=64, height=48, depth_range=(-3.0, 0.2)),
    "near_plane": dict(n=200, width=64, height=48, depth_range=(-0.5, 1.5)),
    "huge": dict(n=20, width=203, height=113, log_scale=(0.0, 1.6)),
    "tiny": dict(n=300, width=203, height=113, log_scale=(-13.8, -9.2)),
    "off_screen": dict(n=1000, width=64, height=48, spread=8.0, log_scale=(-3.0, -1.0)),
}


@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_gradients_edge_cases(gpu_device: torch.device, case: str) -> None:
    seed = fresh_seed()
    kw = dict(EDGE_CASES[case])
    args = splat_scenes.scene(
        kw.pop("n"), kw.pop("width"), kw.pop("height"), seed, gpu_device, **kw
    )
    found = check_gradients(args, f"{case} scene={seed}")
    if case == "behind":  # nothing visible: only the background gets a gradient
        assert found["means"]["rel_l2"] == 0.0


def test_depth_gradient_without_cancellation(gpu_device: torch.device) -> None:
    """A regression scene: one large, faint Gaussian (radius 74 px, opacity 0.07) under a loss
    on depth. When alpha was 1 - T and depth's gradient went through T, the float32
    cancellation at pixels of alpha ~1/255 put 3e-4 into the rotation gradient; depth is now
    sum z w / sum w and its channel (z - depth) / alpha."""
    args = splat_scenes.scene(
        1, 203, 113, 1619775228, gpu_device, spread=0.2, log_scale=(-2.0, -1.0)
    )
    found = check_gradients(args, "one faint Gaussian", seed=490837865)
    assert found["rotations"]["rel_l2"] < 2e-5, found


def test_gradients_at_alpha_threshold(gpu_device: torch.device) -> None:
    """A regression scene (failed once on an H200: means gradient relative L2 3.3e-4).
    Gaussian 128 (depth 0.85, radius 19 px) has alpha 1/255 * (1 + 8.6e-7) at pixel (10, 18)
    and Gaussian 15 1/255 * (1 + 4.8e-7) at pixel (49, 23), which the kernel's float32 alpha
    puts just below 1/255. With those pixels in the loss, the gradients of 128 and 15 (and,
    through the transmittance, the opacity gradients of the Gaussians in front) differ from
    float64 by those pixels' shares; moving the inputs by 6e-8 (relative) moves the float64
    reference's means gradient by 2.7e-4 as well. The loss now skips such pixels."""
    args = splat_scenes.scene(
        200, 64, 48, 2103909774, gpu_device, sh_degree=2, depth_range=(-0.5, 4.0)
    )
    skip = decision_pixels(args)
    assert bool(skip[18, 10]) and bool(skip[23, 49]), skip.nonzero().tolist()
    assert int(skip.sum()) <= 0.01 * skip.numel(), skip.nonzero().tolist()
    check_gradients(args, "alpha-threshold scene=2103909774", extra=True, seed=1716718910)


def test_gradients_at_depth_tie(gpu_device: torch.device) -> None:
    """A regression scene (issue 10, failed once on an H200: background gradient relative L2
    1.4e-3). Gaussians 568 and 581 lie 1.2e-8 apart at depth 1.364, one float32 depth: the
    kernel composites them in index order, 568 first. The reference ordered them by float64
    depth, 581 first; at pixels (52, 34) and (56, 34) the pair meets the 1e-4 stop, so each
    side composited one of them and left out the other, and the final transmittance differed
    by 8 % (1.006e-4 vs 1.098e-4). The reference now orders by float32 depth, ties by index
    (``compositing_order``), and both take the same order."""
    args = splat_scenes.scene(1500, 64, 48, 3973149830, gpu_device, log_scale=(-2.5, -1.0))
    ref = reference(
        **{k: (v.cpu().double() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    )
    z = ref.depths.detach()
    assert bool(z[568].float() == z[581].float()) and bool(z[581] < z[568])  # still a tie
    bg = args["background"].clone().requires_grad_()
    got = rasterize(**{**args, "background": bg})
    (got.image[0, 34, 52] + got.image[1, 34, 56]).backward()  # bg.grad: final transmittance
    assert bg.grad is not None
    for ch, x in ((0, 52), (1, 56)):
        want = 1 - float(ref.alpha[34, x])
        assert abs(float(bg.grad[ch]) - want) <= 1e-4 * want, (x, float(bg.grad[ch]), want)
    skip = decision_pixels(args)
    # (52, 34) stays in the loss (T 1.006e-4 after 568); (56, 34), 1.0008e-4 after 568, is
    # within T_RTOL of the stop and left out
    assert not bool(skip[34, 52]), skip.nonzero().tolist()
    assert int(skip.sum()) <= 0.02 * skip.numel(), int(skip.sum())  # 57 of 3072
    found = check_gradients(args, "depth-tie scene=3973149830", seed=1515521614)
    assert found["background"]["rel_l2"] < 1e-5, found["background"]


@pytest.mark.parametrize("pixels", ["2", "4"])
def test_gradients_of_each_backward_layout(
    gpu_device: torch.device, monkeypatch: pytest.MonkeyPatch, pixels: str
) -> None:
    """The render backward's layouts (pixels of one column a thread walks, tuning only:
    GPUCHECK_SPLAT_BACKWARD_PIXELS; the other tests run the build's default): each against the
    reference, on the dense scene (long lists, warps that stop at different list positions)
    and an SH scene whose size is no tile multiple (threads with pixels off the image)."""
    monkeypatch.setenv("GPUCHECK_SPLAT_BACKWARD_PIXELS", pixels)
    seed = fresh_seed()
    kw = dict(EDGE_CASES["dense"])
    args = splat_scenes.scene(
        kw.pop("n"), kw.pop("width"), kw.pop("height"), seed, gpu_device, **kw
    )
    check_gradients(args, f"dense, {pixels} pixels a thread, scene={seed}")
    args = splat_scenes.scene(300, 203, 113, seed, gpu_device, sh_degree=3)
    check_gradients(args, f"sh3 113x203, {pixels} pixels a thread, scene={seed}", extra=True)


def test_bad_backward_layout(gpu_device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCHECK_SPLAT_BACKWARD_PIXELS", "3")
    args = splat_scenes.scene(20, 37, 21, fresh_seed(), gpu_device)
    means = args["means"].clone().requires_grad_()
    image = rasterize(**{**args, "means": means}).image
    with pytest.raises(ValueError, match="GPUCHECK_SPLAT_BACKWARD_PIXELS must be 2 or 4, got '3'"):
        image.sum().backward()


def test_no_gaussians(gpu_device: torch.device) -> None:
    args = splat_scenes.scene(0, 37, 21, fresh_seed(), gpu_device)
    bg = args["background"].clone().requires_grad_()
    means = args["means"].clone().requires_grad_()
    got = rasterize(**{**args, "background": bg, "means": means})
    weights = torch.randn(3, 21, 37, device=gpu_device)
    (got.image * weights).sum().backward()
    assert means.grad is not None and means.grad.shape == (0, 3)
    torch.testing.assert_close(bg.grad, weights.sum((1, 2)))


def test_gradients_repeatable(gpu_device: torch.device) -> None:
    """Gradients are sums of float atomics: equal to rounding over repeats, not bitwise."""
    args = splat_scenes.scene(
        3000, 128, 96, fresh_seed(), gpu_device, sh_degree=3, log_scale=(-3.5, -1.5)
    )
    weights = torch.randn(3, 96, 128, device=gpu_device)

    def run() -> dict[str, torch.Tensor]:
        leaves = {
            k: args[k].clone().requires_grad_()
            for k in ("means", "scales", "rotations", "opacities", "sh")
        }
        (rasterize(**{**args, **leaves}).image * weights).sum().backward()
        return {k: v.grad for k, v in leaves.items()}

    first = run()
    for _ in range(4):
        again = run()
        for name, g in again.items():
            scale = float(first[name].abs().max())
            assert float((g - first[name]).abs().max()) <= 1e-5 * scale, name


def test_gradients_in_other_device_and_stream(
    gpu_device: torch.device, other_device: torch.device | None
) -> None:
    before = torch.cuda.current_device()
    args = splat_scenes.scene(300, 64, 48, fresh_seed(), gpu_device, sh_degree=1)
    stream = torch.cuda.Stream(device=gpu_device)
    stream.wait_stream(torch.cuda.current_stream(gpu_device))
    with torch.cuda.stream(stream):
        means = args["means"].clone().requires_grad_()
        rasterize(**{**args, "means": means}).image.sum().backward()
    stream.synchronize()
    assert means.grad is not None and means.grad.device == gpu_device
    assert bool(means.grad.abs().sum() > 0)
    assert torch.cuda.current_device() == before


def test_opcheck_with_gradients(gpu_device: torch.device) -> None:
    for degree in (None, 3):
        a = splat_scenes.scene(60, 37, 21, fresh_seed(), gpu_device, sh_degree=degree)
        values = (a["colors"] if degree is None else a["sh"]).clone().requires_grad_()
        leaves = [a[k].clone().requires_grad_() for k in ("means", "scales", "rotations")]
        proj_args = (
            *leaves,
            a["opacities"],
            values,
            a["viewmat"],
            a["K"],
            a["background"],
            a["width"],
            a["height"],
            -1 if degree is None else degree,
            None,
        )
        torch.library.opcheck(ops().project, proj_args)
        means2d, conics, rgb, depths, _, _, ranges, ids, _, _ = ops().project(*proj_args)
        render_args = (
            *(t.detach().clone().requires_grad_() for t in (means2d, conics)),
            a["opacities"].clone().requires_grad_(),
            *(t.detach().clone().requires_grad_() for t in (rgb, depths)),
            a["background"].clone().requires_grad_(),
            ranges,
            ids,
            a["width"],
            a["height"],
        )
        torch.library.opcheck(ops().render, render_args)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_opcheck_with_half_gradients(gpu_device: torch.device, dtype: str) -> None:
    """16-bit parameters, every one requiring grad (opacities and background reach theirs
    through the projection's float32 copies)."""
    for degree in (None, 3):
        a = splat_scenes.scene(60, 37, 21, fresh_seed(), gpu_device, sh_degree=degree)
        a = splat_scenes.to(a, gpu_device, getattr(torch, dtype))
        values = a["colors"] if degree is None else a["sh"]
        leaves = [
            t.clone().requires_grad_()
            for t in (a["means"], a["scales"], a["rotations"], a["opacities"], values)
        ]
        proj_args = (
            *leaves,
            a["viewmat"],
            a["K"],
            a["background"].clone().requires_grad_(),
            a["width"],
            a["height"],
            -1 if degree is None else degree,
            None,
        )
        torch.library.opcheck(ops().project, proj_args)


HALF = [torch.bfloat16, torch.float16]
HALF_SCENES = {  # name: (n, width, height, scene keyword arguments, extra, image_only)
    "rgb_113x203": (300, 203, 113, {}, False, False),
    "sh3_113x203": (300, 203, 113, {"sh_degree": 3}, False, False),
    "image_only_sh3": (300, 203, 113, {"sh_degree": 3}, False, True),
    "outputs_64x48": (200, 64, 48, {"sh_degree": 2, "depth_range": (-0.5, 4.0)}, True, False),
}


@pytest.mark.parametrize("dtype", HALF, ids=["bfloat16", "float16"])
@pytest.mark.parametrize("case", list(HALF_SCENES))
def test_half_gradients(gpu_device: torch.device, dtype: torch.dtype, case: str) -> None:
    """16-bit parameters: every gradient in the parameters' dtype, against the float64
    reference fed the same values (REL_L2_HALF)."""
    n, w, h, kw, extra, image_only = HALF_SCENES[case]
    seed = fresh_seed()
    args = splat_scenes.to(splat_scenes.scene(n, w, h, seed, gpu_device, **kw), gpu_device, dtype)
    check_gradients(args, f"{dtype} {case} scene={seed}", extra=extra, image_only=image_only)


@pytest.mark.parametrize("dtype", HALF, ids=["bfloat16", "float16"])
def test_half_gradients_are_float32_ones_rounded(
    gpu_device: torch.device, dtype: torch.dtype
) -> None:
    """The gradients of 16-bit parameters are those of the same values as float32 parameters,
    rounded once: within one unit in the last place of the 16-bit type (plus the float32
    atomics' run-to-run rounding, 1e-5 of the largest gradient)."""
    seed = fresh_seed()
    half = splat_scenes.to(
        splat_scenes.scene(300, 203, 113, seed, gpu_device, sh_degree=3), gpu_device, dtype
    )
    weights = torch.randn(3, 113, 203, generator=torch.Generator().manual_seed(seed))
    weights = weights.to(gpu_device)
    names = ("means", "scales", "rotations", "opacities", "sh", "background")

    def run(args: dict[str, Any]) -> dict[str, torch.Tensor]:
        leaves = {k: args[k].clone().requires_grad_() for k in names}
        got = rasterize(**{**args, **leaves})
        ((got.image * weights).sum() + (got.alpha * weights[0]).sum()).backward()
        return {k: v.grad for k, v in leaves.items()}

    got, want = run(half), run(splat_scenes.to(half, gpu_device))
    info = torch.finfo(dtype)
    for name in names:
        g, w = got[name], want[name]
        assert g.dtype == dtype and w.dtype == torch.float32, name
        err = (g.float() - w).abs()
        bound = info.eps * w.abs() + 1e-5 * float(w.abs().max()) + info.tiny * info.eps
        worst = int((err - bound).argmax())
        assert bool((err <= bound).all()), (
            f"{dtype} seed={seed} grad {name}: {float(err.flatten()[worst]):.3g} off at "
            f"element {worst} (float32 {float(w.flatten()[worst]):.6g}, "
            f"{dtype} {float(g.flatten()[worst]):.6g})"
        )
    assert bool(got["opacities"].abs().sum() > 0) and bool(got["sh"].abs().sum() > 0)
