"""GPU suite of the fused SSIM kernels (gpucheck.ops.ssim) against the reference.

Every test runs on each target device (``gpu_device``) while *another* device is current and
initialized (failure 1 of docs/failures.md: an unguarded SSIM extension crashed on cuda:1).
Inputs are fresh random images each run; the seed is printed so a failure can be replayed.
Two kinds of images: noise (large local variance) and smooth fields at any brightness, where
the variances a fused kernel forms as E[x²] - mu² cancel and its rounding error is largest
(the bounds scale with :func:`gpucheck.kernels.ssim.reference.rounding_sensitivity`).
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F

from gpucheck.kernels.ssim.op import load_ops, ssim
from gpucheck.kernels.ssim.reference import rounding_sensitivity
from gpucheck.kernels.ssim.reference import ssim as ref_ssim

pytestmark = [pytest.mark.gpu, pytest.mark.gpucheck_kernels]

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SIZES = [(1, 1, 1, 1), (1, 1, 11, 11), (2, 3, 113, 203), (5, 3, 1080, 1920)]
SMALL = [(1, 1, 1, 1), (1, 1, 11, 11), (2, 3, 113, 203)]
IMAGES = ("noise", "smooth")
# The bounds of the comparisons with the float64 reference; each check's share of its bound
# over many seeds is measured by benchmarks/tolerances.py (its numbers in benchmarks/HISTORY.md,
# "SSIM and KNN tolerances from measurement"). Forward map and mean: (rtol, atol) elementwise.
MAP_TOL = {torch.float32: (2e-4, 5e-5), torch.float64: (1e-10, 1e-12)}
# Gradients: relative L2 error.
GRAD_REL_TOL = {torch.float32: 1e-4, torch.float64: 1e-10}
# Where the images are smooth the variances cancel: map values may also err by KAPPA_MAP u s
# per pixel and gradients by KAPPA_GRAD u |e| in L2 norm (u: the unit roundoff of the
# kernel's arithmetic, float32 for 16-bit images; s, e: rounding_sensitivity's estimates).
# Bright smooth images in float32: s up to ~4e3, u s ~ 3e-4 on the map. The constants needed, over
# fresh seeds (benchmarks/tolerances.py): <= 2.9 (map) and 5.6 (gradients, one map pixel:
# 1x1x11x11 "valid") on an H200 and an H100; torch's own float32 SSIM on CPU: 9.4 and 20.
KAPPA_MAP = 16.0
KAPPA_GRAD = 32.0
UNIT_ROUNDOFF = {
    torch.float32: 2.0**-24,
    torch.float64: 2.0**-53,
    torch.float16: 2.0**-24,
    torch.bfloat16: 2.0**-24,
}
# 16-bit types: the kernel's relative error <= 2x the error of the reference run in that dtype
# plus a floor of 4 units of roundoff (the result's own rounding is up to 1; at a floor of 2
# the worst of ~10^4 float16 gradient checks used 73 % of its bound).
LOWP_FLOOR = {torch.float16: 4 * 2.0**-11, torch.bfloat16: 4 * 2.0**-8}
# Gradients: an absolute term besides the relative one, per element in units of the loss's
# gradient scale (1 for reduction 'none' with weights ~1, loss scale / N for 'mean'). Where
# img1 ~ img2 the gradient vanishes (SSIM is at its maximum) while its rounding does not: a
# 1x1 image with |x - y| ~ 1e-3 gave a float32 relative error of 2.5e-4 (one seed in 180,
# H200) and a float16 pair rounded to equal values a gradient of exactly 0 in float64; the
# absolute errors measured there were <= 2.1e-8 (float32) and 2.4e-7 (float16) per unit. With
# float32 at 2e-7 the worst of ~800 checks on an H100 used 63 % of its bound: now 5e-7.
GRAD_ABS_TOL = {
    torch.float32: 5e-7,
    torch.float64: 1e-14,
    torch.float16: 2e-6,
    torch.bfloat16: 2e-6,
}


def _size_params(sizes: list[tuple[int, ...]]) -> list[object]:
    return [
        pytest.param(
            s,
            id="x".join(map(str, s)),
            marks=[pytest.mark.sanitizer] if s[2] * s[3] <= 113 * 203 else [],
        )
        for s in sizes
    ]


def _images(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
    seed: int | None = None,
    kind: str = "noise",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two correlated random images in [0, 1] (never zeros); prints the seed.

    ``kind``: "noise" (uniform, y = 0.7 x + 0.3 noise) or "smooth" (uniform noise box-blurred
    twice, standard deviation ~0.013 over the 11x11 window, shifted per plane to a brightness
    in 0.1..0.95; y = x + 0.002 noise)."""
    seed = random.randrange(2**31) if seed is None else seed
    print(f"seed={seed} shape={shape} dtype={dtype} device={device} images={kind}")
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.rand(shape, generator=gen, device=device, dtype=torch.float32)
    noise = torch.rand(shape, generator=gen, device=device, dtype=torch.float32)
    if kind == "noise":
        y = (0.7 * x + 0.3 * noise).clamp(0, 1)
    elif kind == "smooth":
        box = torch.full((shape[1], 1, 9, 9), 1 / 81, device=device)
        for _ in range(2):
            x = F.conv2d(x, box, padding=4, groups=shape[1])
        level = 0.1 + 0.85 * torch.rand((*shape[:2], 1, 1), generator=gen, device=device)
        x = (x - 0.5 + level).clamp(0, 1)
        y = (x + 0.002 * (noise - 0.5)).clamp(0, 1)
    else:
        raise ValueError(f"images: 'noise' or 'smooth', got {kind!r}")
    return x.to(dtype), y.to(dtype)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error of a against ref (both upcast to float64)."""
    a, ref = a.double(), ref.double()
    assert torch.isfinite(a).all(), "non-finite values"
    return float((a - ref).norm() / ref.norm().clamp_min(1e-300))


def _norm(t: torch.Tensor) -> float:
    return float(t.double().norm())


def _dist(a: torch.Tensor, ref: torch.Tensor) -> float:
    """L2 distance of a from ref (float64); inf where a is not finite."""
    return float((a.double() - ref.double()).norm()) if torch.isfinite(a).all() else math.inf


def _used(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float | torch.Tensor) -> float:
    """How much of the elementwise tolerance ``atol + rtol |want|`` the worst element uses
    (NaN where got has a NaN)."""
    return float(((got.double() - want).abs() / (atol + rtol * want.abs())).max())


def _paddings(shape: tuple[int, ...]) -> list[str]:
    return ["same", "valid"] if min(shape[2:]) >= 11 else ["same"]


def _loss_weights(out: torch.Tensor) -> torch.Tensor:
    """Random upstream gradient for reduction='none' (so every map pixel matters)."""
    return torch.rand(out.shape, device=out.device, dtype=torch.float32) + 0.5


class Check(NamedTuple):
    """One comparison with the float64 reference: the error and the bound it must stay under
    (the tests assert ``err <= bound``; ``benchmarks/tolerances.py`` records ``err / bound``
    over many seeds, which is where the bounds come from)."""

    what: str
    err: float
    bound: float
    #: gradients: the bound's relative part, and its absolute unit (bound = relative part +
    #: GRAD_ABS_TOL x unit), so that the measurement can tell which absolute term it needed
    relative: float = 0.0
    unit: float = 0.0
    #: the constant of the rounding-sensitivity term (KAPPA_MAP / KAPPA_GRAD) this comparison
    #: needed beyond the bound's other terms (0: none; float32/64 maps and all gradients)
    kappa: float = 0.0


def forward_checks(x: torch.Tensor, y: torch.Tensor, padding: str) -> list[Check]:
    """The forward map and mean of ``x``, ``y`` (one dtype) against the float64 reference.
    float32/64: the share of the elementwise ``atol + rtol |want| + KAPPA_MAP u s`` (MAP_TOL,
    s from rounding_sensitivity; the mean against the map's mean of it) the worst element
    uses, against 1; 16-bit: the relative L2 error against twice the reference's own error in
    that dtype + LOWP_FLOOR + the kernel's float32 term KAPPA_MAP u |s| / |want|."""
    dtype, device = x.dtype, x.device
    got_map = ssim(x, y, padding=padding, train=False, reduction="none")
    got_mean = ssim(x, y, padding=padding, train=False)
    want_map = ref_ssim(x.double(), y.double(), padding=padding, reduction="none")
    assert got_map.dtype == dtype and got_map.shape == want_map.shape
    assert got_map.device == device and got_mean.shape == ()
    u_s = UNIT_ROUNDOFF[dtype] * rounding_sensitivity(x, y, padding).map
    if dtype in MAP_TOL:
        rtol, atol = MAP_TOL[dtype]
        diff = (got_map.double() - want_map).abs()
        assert not diff.isnan().any(), "NaN in the map"
        kappa = float(((diff - atol - rtol * want_map.abs()).clamp_min(0) / u_s).max())
        bound = atol + KAPPA_MAP * u_s
        return [
            Check(f"{padding} map", _used(got_map, want_map, rtol, bound), 1.0, kappa=kappa),
            Check(f"{padding} mean", _used(got_mean, want_map.mean(), rtol, bound.mean()), 1.0),
        ]
    lowp_map = ref_ssim(x, y, padding=padding, reduction="none")
    err, ref_err = _rel(got_map, want_map), _rel(lowp_map, want_map)
    err_mean = abs(float(got_mean) - float(want_map.mean()))
    ref_err_mean = abs(float(lowp_map.double().mean()) - float(want_map.mean()))
    # the kernel's float32 arithmetic: KAPPA_MAP u s, relative (map) / absolute (mean)
    sens_map = KAPPA_MAP * _norm(u_s) / max(_norm(want_map), 1e-300)
    return [
        Check(f"{padding} map", err, 2 * ref_err + LOWP_FLOOR[dtype] + sens_map),
        Check(
            f"{padding} mean",
            err_mean,
            2 * ref_err_mean + LOWP_FLOOR[dtype] + KAPPA_MAP * float(u_s.mean()),
        ),
    ]


def backward_checks(x: torch.Tensor, y: torch.Tensor, padding: str, reduction: str) -> list[Check]:
    """The gradients of both images against the float64 reference's: the L2 distance against
    a relative part of the reference gradient's norm (float32/64: GRAD_REL_TOL; 16-bit: twice
    the reference's own relative error in that dtype + LOWP_FLOOR), plus KAPPA_GRAD u |e| (e
    from rounding_sensitivity, u of the kernel's arithmetic), plus GRAD_ABS_TOL."""
    dtype = x.dtype
    a = x.clone().requires_grad_(True)
    b = y.clone().requires_grad_(True)
    out = ssim(a, b, padding=padding, train=True, reduction=reduction)
    w = _loss_weights(out) if reduction == "none" else None
    # Fresh float64 leaves: for float64 images x.double() would be x itself, and
    # requires_grad_ on it made every later x.clone() a non-leaf (grad never set).
    a64 = x.detach().to(torch.float64, copy=True).requires_grad_(True)
    b64 = y.detach().to(torch.float64, copy=True).requires_grad_(True)
    out64 = ref_ssim(a64, b64, padding=padding, reduction=reduction)
    (out64 if w is None else (out64 * w.double()).sum()).backward()
    assert a64.grad is not None and b64.grad is not None
    # float16 gradients of a mean over many pixels (~1/N) underflow in any
    # implementation: scale the loss by a power of two, as mixed-precision training
    # does, so that the largest gradient is about 1000 (far from overflow too).
    scale = 1.0
    if dtype == torch.float16 and w is None:
        peak = max(float(a64.grad.abs().max()), float(b64.grad.abs().max()), 1e-30)
        scale = 2.0 ** min(14, max(0, math.floor(math.log2(1000 / peak))))
        a64.grad *= scale
        b64.grad *= scale
    (out * scale if w is None else (out.float() * w).sum()).backward()
    assert a.grad is not None and b.grad is not None
    assert a.grad.dtype == dtype and a.grad.shape == x.shape
    # the absolute term: GRAD_ABS_TOL per element, in units of the gradient's scale
    unit = (scale / x.numel() if w is None else 1.0) * math.sqrt(x.numel())
    absolute = GRAD_ABS_TOL[dtype] * unit
    case = f"{padding} {reduction}"
    if w is None:  # the mean's gradient with respect to the map (times the loss scale)
        shape = x.shape if padding == "same" else (*x.shape[:2], x.shape[2] - 10, x.shape[3] - 10)
        upstream = torch.full(shape, scale / math.prod(shape), device=x.device)
    else:
        upstream = w
    sens = rounding_sensitivity(x, y, padding, upstream)
    assert sens.grad1 is not None and sens.grad2 is not None
    u_e1 = UNIT_ROUNDOFF[dtype] * _norm(sens.grad1)
    u_e2 = UNIT_ROUNDOFF[dtype] * _norm(sens.grad2)
    if dtype in GRAD_REL_TOL:
        checks = []
        for got, want, u_e, name in (
            (a.grad, a64.grad, u_e1, "img1"),
            (b.grad, b64.grad, u_e2, "img2"),
        ):
            err, relative = _dist(got, want), GRAD_REL_TOL[dtype] * _norm(want)
            kappa = max(0.0, err - relative - absolute) / u_e if u_e > 0 else 0.0
            relative += KAPPA_GRAD * u_e
            checks.append(Check(f"{case} {name}", err, relative + absolute, relative, unit, kappa))
        return checks
    al = x.clone().requires_grad_(True)
    bl = y.clone().requires_grad_(True)
    outl = ref_ssim(al, bl, padding=padding, reduction=reduction)
    (outl * scale if w is None else (outl.float() * w).sum()).backward()
    checks = []
    for got, lowp, want, u_e, name in (
        (a.grad, al.grad, a64.grad, u_e1, "img1"),
        (b.grad, bl.grad, b64.grad, u_e2, "img2"),
    ):
        # The reference's own float16 backward can overflow under the loss scale
        # (its intermediate gradients exceed 65504 at tiny sizes): then only the floor
        # bounds the kernel's error.
        ref_err = _rel(lowp, want) if torch.isfinite(lowp).all() else math.inf
        rel = LOWP_FLOOR[dtype] + (2 * ref_err if math.isfinite(ref_err) else 0.0)
        err, relative = _dist(got, want), rel * _norm(want)
        kappa = max(0.0, err - relative - absolute) / u_e if u_e > 0 else 0.0
        relative += KAPPA_GRAD * u_e  # the kernel's float32 arithmetic
        checks.append(Check(f"{case} {name}", err, relative + absolute, relative, unit, kappa))
    return checks


def _assert_within(checks: list[Check]) -> None:
    over = [c for c in checks if not c.err <= c.bound]
    assert not over, "beyond the measured tolerance: " + "; ".join(
        f"{c.what}: {c.err:.3g} > {c.bound:.3g}" for c in over
    )


@pytest.mark.parametrize("images", IMAGES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", _size_params(SIZES))
def test_forward_matches_reference(
    gpu_device: torch.device, shape: tuple[int, ...], dtype: torch.dtype, images: str
) -> None:
    load_ops()
    x, y = _images(shape, dtype, gpu_device, kind=images)
    for padding in _paddings(shape):
        _assert_within(forward_checks(x, y, padding))


@pytest.mark.parametrize("images", IMAGES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", _size_params(SIZES))
def test_backward_matches_reference(
    gpu_device: torch.device, shape: tuple[int, ...], dtype: torch.dtype, images: str
) -> None:
    load_ops()
    x, y = _images(shape, dtype, gpu_device, kind=images)
    for padding in _paddings(shape):
        for reduction in ("none", "mean"):
            _assert_within(backward_checks(x, y, padding, reduction))


@pytest.mark.sanitizer
def test_inference_records_no_graph_and_matches_train(gpu_device: torch.device) -> None:
    x, y = _images((2, 3, 37, 29), torch.float32, gpu_device)
    a = x.clone().requires_grad_(True)
    trained = ssim(a, y, train=True)
    inferred = ssim(a, y, train=False)
    assert trained.grad_fn is not None
    assert inferred.grad_fn is None and not inferred.requires_grad
    assert torch.equal(trained.detach(), inferred)


@pytest.mark.sanitizer
def test_only_img1_requires_grad(gpu_device: torch.device) -> None:
    x, y = _images((2, 3, 40, 53), torch.float32, gpu_device)
    a1 = x.clone().requires_grad_(True)
    ssim(a1, y).backward()
    a2 = x.clone().requires_grad_(True)
    b2 = y.clone().requires_grad_(True)
    ssim(a2, b2).backward()
    assert a1.grad is not None and torch.equal(a1.grad, a2.grad)
    assert b2.grad is not None and b2.grad.abs().sum() > 0


@pytest.mark.sanitizer
@pytest.mark.parametrize("padding", ["same", "valid"])
def test_non_contiguous_inputs(gpu_device: torch.device, padding: str) -> None:
    x, y = _images((2, 3, 60, 90), torch.float32, gpu_device)
    xs, ys = x[..., ::2], y[..., ::2]  # strided views
    xc = x.contiguous(memory_format=torch.channels_last)  # same values, other strides
    assert not xs.is_contiguous() and not xc.is_contiguous()
    torch.testing.assert_close(
        ssim(xs, ys, padding=padding, reduction="none"),
        ssim(xs.contiguous(), ys.contiguous(), padding=padding, reduction="none"),
        rtol=0,
        atol=0,
    )
    base = torch.zeros(2, 3, 60, 90, device=gpu_device)
    base[..., ::2] = xs
    a = base[..., ::2].detach().requires_grad_(True)  # a strided leaf
    assert not a.is_contiguous()
    ssim(a, ys, padding=padding).backward()
    b = xs.contiguous().requires_grad_(True)
    ssim(b, ys.contiguous(), padding=padding).backward()
    assert torch.equal(a.grad, b.grad)
    assert torch.equal(ssim(xc, y, padding=padding), ssim(x, y, padding=padding))


@pytest.mark.sanitizer
def test_mixed_devices_are_rejected(
    gpu_device: torch.device, other_device: torch.device | None
) -> None:
    x, y = _images((1, 3, 16, 16), torch.float32, gpu_device)
    with pytest.raises(ValueError, match=f"img1 is on {gpu_device} but img2 is on cpu"):
        ssim(x, y.cpu())
    with pytest.raises(ValueError, match="img1 must be a CUDA tensor, got one on cpu"):
        ssim(x.cpu(), y.cpu())
    if other_device is None:
        pytest.skip("mixed CUDA devices need two visible devices")
    with pytest.raises(ValueError, match=f"img1 is on {gpu_device} but img2 is on {other_device}"):
        ssim(x, y.to(other_device))


@pytest.mark.sanitizer
@pytest.mark.parametrize(
    ("shape1", "shape2", "dtype", "kwargs", "exc", "match"),
    [
        (
            (0, 3, 16, 16),
            (0, 3, 16, 16),
            torch.float32,
            {},
            ValueError,
            r"must not be empty, got shape \[0, 3, 16, 16\]",
        ),
        (
            (1, 3, 0, 16),
            (1, 3, 0, 16),
            torch.float32,
            {},
            ValueError,
            r"must not be empty, got shape \[1, 3, 0, 16\]",
        ),
        (
            (3, 16, 16),
            (3, 16, 16),
            torch.float32,
            {},
            ValueError,
            r"\[B, C, H, W\], got shape \[3, 16, 16\]",
        ),
        (
            (1, 1, 3, 16, 16),
            (1, 1, 3, 16, 16),
            torch.float32,
            {},
            ValueError,
            r"got shape \[1, 1, 3, 16, 16\]",
        ),
        (
            (1, 3, 16, 16),
            (1, 3, 16, 15),
            torch.float32,
            {},
            ValueError,
            r"same shape, got \[1, 3, 16, 16\] and \[1, 3, 16, 15\]",
        ),
        (
            (1, 3, 16, 16),
            (1, 3, 16, 16),
            torch.int32,
            {},
            TypeError,
            "floating-point tensor, got torch.int32",
        ),
        ((1, 3, 16, 16), (1, 3, 16, 16), torch.uint8, {}, TypeError, "got torch.uint8"),
        (
            (1, 3, 8, 16),
            (1, 3, 8, 16),
            torch.float32,
            {"padding": "valid"},
            ValueError,
            r"H, W >= 11, got \[8, 16\]",
        ),
        (
            (1, 3, 16, 16),
            (1, 3, 16, 16),
            torch.float32,
            {"padding": "reflect"},
            ValueError,
            "got 'reflect'",
        ),
        (
            (1, 3, 16, 16),
            (1, 3, 16, 16),
            torch.float32,
            {"reduction": "sum"},
            ValueError,
            "got 'sum'",
        ),
    ],
)
def test_bad_inputs_raise_clear_errors(
    gpu_device: torch.device,
    shape1: tuple[int, ...],
    shape2: tuple[int, ...],
    dtype: torch.dtype,
    kwargs: dict[str, str],
    exc: type,
    match: str,
) -> None:
    x = (torch.rand(shape1, device=gpu_device) * 100).to(dtype)
    y = (torch.rand(shape2, device=gpu_device) * 100).to(dtype)
    with pytest.raises(exc, match=match):
        ssim(x, y, **kwargs)
    z = torch.rand(1, 3, 16, 16, device=gpu_device)
    with pytest.raises(TypeError, match="same dtype"):
        ssim(z, z.half())


# The kernel's own TORCH_CHECKs (torch.ops.gpucheck.* called directly) run in a child process,
# so that a crash is reported as this test's failure, with its output, instead of ending the
# whole suite.
_KERNEL_CHECKS = r"""
import sys, torch
import gpucheck.kernels.ssim.op as m
m.load_ops()
dev = torch.device("cuda", int(sys.argv[1]))
other = torch.device("cuda", int(sys.argv[2])) if len(sys.argv) > 2 else None
torch.cuda.set_device(other if other is not None else dev)
fwd, bwd = torch.ops.gpucheck.ssim_forward, torch.ops.gpucheck.ssim_backward
def r(*s, dt=torch.float32):
    return (torch.rand(s, device=dev) * 100).to(dt)
x, y = r(1, 3, 16, 16), r(1, 3, 16, 16)
i32 = torch.int32
cases = [
    ("cpu img2", lambda: fwd(x, y.cpu(), "same", "mean"),
     "img2 must be a CUDA tensor, got one on cpu"),
    ("rank", lambda: fwd(r(3, 16, 16), r(3, 16, 16), "same", "mean"),
     "[B, C, H, W], got [3, 16, 16]"),
    ("shape", lambda: fwd(x, r(1, 3, 16, 15), "same", "mean"),
     "img1's shape [1, 3, 16, 16], got [1, 3, 16, 15]"),
    ("int", lambda: fwd(r(1, 3, 4, 4, dt=i32), r(1, 3, 4, 4, dt=i32), "same", "mean"),
     "float64, got Int"),
    ("dtype mix", lambda: fwd(x, y.half(), "same", "mean"), "img1's dtype Float, got Half"),
    ("valid small", lambda: fwd(r(1, 3, 8, 16), r(1, 3, 8, 16), "valid", "none"),
     "H, W >= 11, got [1, 3, 8, 16]"),
    ("padding", lambda: fwd(x, y, "reflect", "mean"),
     'padding must be "same" or "valid", got "reflect"'),
    ("grad shape", lambda: bwd(r(1, 3, 16), x, y, "same", "none", True),
     "grad must be [1, 3, 16, 16], got [1, 3, 16]"),
    ("empty B", lambda: fwd(r(0, 3, 16, 16), r(0, 3, 16, 16), "same", "none"),
     "must not be empty, got [0, 3, 16, 16]"),
    ("empty H", lambda: fwd(r(1, 3, 0, 16), r(1, 3, 0, 16), "same", "mean"),
     "must not be empty, got [1, 3, 0, 16]"),
]
if other is not None:
    cases += [
        ("other device", lambda: fwd(x, y.to(other), "same", "mean"),
         f"img2 is on {other} but img1 is on {dev}"),
        ("grad device", lambda: bwd(torch.ones((), device=other), x, y, "same", "mean", True),
         f"grad is on {other} but img1 is on {dev}"),
    ]
bad = 0
for name, call, want in cases:
    print("case", name, flush=True)
    try:
        call()
        torch.cuda.synchronize()
        print("  NOT RAISED", flush=True)
        bad += 1
    except RuntimeError as err:
        ok = want in str(err)
        bad += not ok
        print("  ok" if ok else f"  WRONG MESSAGE: {err}", flush=True)
print("bad", bad)
sys.exit(1 if bad else 0)
"""


@pytest.mark.sanitizer
def test_kernel_checks_raise_clear_errors(
    gpu_device: torch.device, other_device: torch.device | None
) -> None:
    argv = [sys.executable, "-c", _KERNEL_CHECKS, str(gpu_device.index)]
    if other_device is not None:
        argv.append(str(other_device.index))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"


@pytest.mark.sanitizer
def test_does_not_change_the_current_device(
    gpu_device: torch.device, other_device: torch.device | None
) -> None:
    current = torch.cuda.current_device()
    x, y = _images((1, 3, 32, 32), torch.float32, gpu_device)
    a = x.clone().requires_grad_(True)
    ssim(a, y).backward()
    assert torch.cuda.current_device() == current
    if other_device is not None:
        assert current == other_device.index


@pytest.mark.sanitizer
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradient_computed_ahead_equals_the_recomputed_one(
    gpu_device: torch.device, dtype: torch.dtype
) -> None:
    """reduction='mean' with grad: the forward computes the gradient ahead (for the upstream
    gradient of 1 - ssim, -1) and the backward only scales it, in place, or skips that when
    the factor is 1. Against the backward that recomputes everything (ssim_backward, the path
    of a second backward through the graph): bitwise for upstream -1 and +1 (but float16),
    within rounding otherwise; and img2's gradient when only the second backward asks for it."""
    x, y = _images((2, 3, 67, 91), dtype, gpu_device)
    scale = 2.0**10 if dtype == torch.float16 else 1.0  # keeps float16 gradients normal
    for upstream in (-1.0, 1.0, -2.5, 0.375):
        a = x.clone().requires_grad_(True)
        b = y.clone().requires_grad_(True)
        out = ssim(a, b)
        up = torch.full((), upstream * scale, device=gpu_device, dtype=dtype)
        out.backward(up, retain_graph=True)
        assert a.grad is not None and b.grad is not None
        ahead = (a.grad.clone(), b.grad.clone())
        a.grad = None
        b.grad = None
        out.backward(up)  # the saved gradient is used once: this one recomputes
        assert a.grad is not None and b.grad is not None
        want1, want2 = torch.ops.gpucheck.ssim_backward.default(up, x, y, "same", "mean", True)
        assert torch.equal(a.grad, want1) and torch.equal(b.grad, want2), upstream
        for got, want in zip(ahead, (want1, want2), strict=True):
            # float16 stores the gradient ahead at another power-of-two scale than the
            # recomputed one: values in its subnormal range round differently.
            if upstream in (-1.0, 1.0) and dtype != torch.float16:
                assert torch.equal(got, want), (upstream, float((got - want).abs().max()))
            else:
                assert _rel(got, want) <= {torch.float64: 1e-14, torch.float32: 1e-6}.get(
                    dtype, 4e-3
                ), (upstream, _rel(got, want))
    # img2 did not require grad in the forward: no gradient for it was computed ahead.
    a = x.clone().requires_grad_(True)
    b = y.clone()
    out = ssim(a, b)
    b.requires_grad_(True)
    up = torch.full((), -scale, device=gpu_device, dtype=dtype)
    out.backward(up)
    assert b.grad is None and a.grad is not None
    want1, _ = torch.ops.gpucheck.ssim_backward.default(up, x, y, "same", "mean", False)
    if dtype == torch.float16:
        assert _rel(a.grad, want1) <= 4e-3, _rel(a.grad, want1)
    else:
        assert torch.equal(a.grad, want1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bitwise_reproducible_over_10_repeats(gpu_device: torch.device, dtype: torch.dtype) -> None:
    x, y = _images((2, 3, 270, 480), dtype, gpu_device)
    g = torch.rand(2, 3, 270, 480, device=gpu_device).to(dtype)
    results = []
    for _ in range(10):
        a = x.clone().requires_grad_(True)
        b = y.clone().requires_grad_(True)
        mean = ssim(a, b)
        mean.backward()
        a2 = x.clone().requires_grad_(True)
        smap = ssim(a2, y, reduction="none")
        smap.backward(g)
        results.append((mean.detach(), a.grad, b.grad, smap.detach(), a2.grad))
    for r in results[1:]:
        for got, first in zip(r, results[0], strict=True):
            assert torch.equal(got, first)


def test_identical_on_every_visible_device(gpu_device: torch.device) -> None:
    x, y = _images((2, 3, 113, 203), torch.float32, gpu_device)

    def run(dev: torch.device) -> list[torch.Tensor]:
        a = x.detach().to(dev, copy=True).requires_grad_(True)
        b = y.detach().to(dev, copy=True).requires_grad_(True)
        mean = ssim(a, b, padding="valid")
        mean.backward()
        return [
            t.cpu() for t in (mean.detach(), ssim(a, b, reduction="none").detach(), a.grad, b.grad)
        ]

    here = run(gpu_device)
    for i in range(torch.cuda.device_count()):
        there = run(torch.device("cuda", i))
        for got, want in zip(there, here, strict=True):
            assert torch.equal(got, want), f"cuda:{i} differs from {gpu_device}"


@pytest.mark.sanitizer
@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_opcheck(gpu_device: torch.device, padding: str, reduction: str) -> None:
    load_ops()
    x, y = _images((2, 3, 19, 23), torch.float32, gpu_device)
    a = x.clone().requires_grad_(True)
    b = y.clone().requires_grad_(True)
    torch.library.opcheck(torch.ops.gpucheck.ssim_forward.default, (a, b, padding, reduction))
    grad = (
        torch.rand((), device=gpu_device)
        if reduction == "mean"
        else torch.rand(ssim(x, y, padding=padding, reduction="none").shape, device=gpu_device)
    )
    for need2 in (True, False):
        torch.library.opcheck(
            torch.ops.gpucheck.ssim_backward.default, (grad, x, y, padding, reduction, need2)
        )
    if reduction == "mean":  # the training step's ops (reduction mean only)
        for need2 in (True, False):
            torch.library.opcheck(
                torch.ops.gpucheck.ssim_train.default, (x, y, padding, 1024.0, need2)
            )
        torch.library.opcheck(
            torch.ops.gpucheck.ssim_scale_.default,
            (torch.rand(x.shape, device=gpu_device), grad, 0.25),
        )


@pytest.mark.sanitizer
@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_gradcheck_float64(gpu_device: torch.device, padding: str, reduction: str) -> None:
    x, y = _images((1, 2, 13, 16), torch.float64, gpu_device)
    a = x.requires_grad_(True)
    b = y.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda p, q: ssim(p, q, padding=padding, reduction=reduction), (a, b)
    )


@pytest.mark.sanitizer
def test_identical_images_give_one(gpu_device: torch.device) -> None:
    x, _ = _images((2, 3, 21, 34), torch.float32, gpu_device)
    smap = ssim(x, x.clone(), reduction="none")
    torch.testing.assert_close(smap, torch.ones_like(smap), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_soak_2000_iterations_with_another_device_current(
    gpu_device: torch.device, other_device: torch.device | None
) -> None:
    """Story 1: the unguarded extension crashed after ~1000 training iterations on cuda:1."""
    x, y = _images((1, 3, 540, 960), torch.float32, gpu_device)
    first: list[torch.Tensor] = []
    for i in range(2000):
        a = x.clone().requires_grad_(True)
        loss = 1 - ssim(a, y)
        loss.backward()
        if i == 0:
            first = [loss.detach().clone(), a.grad.clone()]
        elif i % 500 == 499:
            assert torch.equal(loss.detach(), first[0]) and torch.equal(a.grad, first[1]), i
    torch.cuda.synchronize(gpu_device)
    if other_device is not None:
        torch.cuda.synchronize(other_device)
        assert torch.cuda.current_device() == other_device.index
    assert torch.isfinite(first[1]).all() and 0 < float(first[0]) < 1
