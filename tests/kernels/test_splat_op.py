"""CPU tests of gpucheck.ops.rasterize's Python side: argument checks that need no GPU, the
fake (meta) implementations' shapes, the scenes the GPU suite renders, a float64 gradcheck of
the reference (the oracle of the kernel's gradients) and gpucheck.MemoryAnomalyError's fields
from recorded preflight messages."""

from __future__ import annotations

import sys

import pytest
import torch

import gpucheck
from gpucheck import _resources
from gpucheck.errors import BudgetExceeded
from gpucheck.kernels.splat import op as splat
from gpucheck.reference import rasterize as reference

sys.path.insert(0, str(_resources.suites() / "splat"))  # the installed suite's
import splat_scenes


def _scene(**change):
    args = splat_scenes.scene(4, 20, 10, 3)
    args.update(change)
    return args


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (dict(), ValueError, r"means must be a CUDA tensor, got one on cpu .*reference"),
        (dict(means=[[0.0, 0.0, 1.0]]), TypeError, r"means must be a torch.Tensor, got list"),
        (dict(width=10.5), TypeError, r"width must be an int"),
        (dict(height=True), TypeError, r"height must be an int"),
        (dict(width=0), ValueError, r"width must be a positive int"),
        (dict(max_bytes=1.5), TypeError, r"max_bytes must be None or an int"),
        (dict(max_bytes=-1), ValueError, r"max_bytes must be None or >= 0"),
        (dict(sh=torch.rand(4, 4, 3)), ValueError, r"exactly one of colors"),
        (dict(colors=None), ValueError, r"exactly one of colors"),
        (dict(sh_degree=1), ValueError, r"sh_degree only applies with sh"),
        (dict(colors=None, sh=torch.rand(4, 5, 3)), ValueError, r"\(d \+ 1\)\^2 coefficients"),
        (dict(colors=None, sh=torch.rand(4, 25, 3)), ValueError, r"\(d \+ 1\)\^2 coefficients"),
        (
            dict(colors=None, sh=torch.rand(4, 16, 3), sh_degree=4),
            ValueError,
            r"sh_degree must be an int in 0..3, got 4",
        ),
        (dict(colors=None, sh=torch.rand(4, 3)), ValueError, r"sh must be \[N, K, 3\]"),
    ],
)
def test_argument_errors_without_gpu(change, error, match) -> None:
    """Everything but the device is checked before the CPU tensors are refused."""
    with pytest.raises(error, match=match):
        splat.rasterize(**_scene(**change))


def test_sh_degree_defaults_to_what_sh_holds() -> None:
    for degree in range(4):
        assert splat.sh_degree_of(None, torch.rand(2, (degree + 1) ** 2, 3), None) == degree
    assert splat.sh_degree_of(None, torch.rand(2, 16, 3), 1) == 1
    assert splat.sh_degree_of(torch.rand(2, 3), None, None) == -1


def test_fake_impl_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The four ops' fake implementations: shapes and dtypes (the overlap count is a dynamic
    size under FakeTensor; here a stand-in)."""
    monkeypatch.setattr(splat, "_overlaps", lambda: 11)
    a = splat_scenes.to(splat_scenes.scene(7, 21, 13, 5, sh_degree=2), "meta")
    out = splat._fake_project(
        a["means"],
        a["scales"],
        a["rotations"],
        a["opacities"],
        a["sh"],
        a["viewmat"],
        a["K"],
        a["background"],
        21,
        13,
        2,
        None,
    )
    assert [tuple(o.shape) for o in out] == [
        (7, 2),
        (7, 3),
        (7, 3),
        (7,),
        (7,),
        (7, 4),
        (2 * 1, 2),
        (11,),
        (0,),
        (0,),
    ]
    assert [o.dtype for o in out] == [torch.float32] * 4 + [torch.int32] * 4 + [torch.float32] * 2
    means2d, conics, rgb, depths, radii, _, ranges, ids, _, _ = out
    img = splat._fake_render(
        means2d, conics, a["opacities"], rgb, depths, a["background"], ranges, ids, 21, 13
    )
    assert [tuple(o.shape) for o in img] == [(3, 13, 21)] + [(13, 21)] * 4
    assert [o.dtype for o in img] == [torch.float32] * 4 + [torch.int32]
    grads = splat._fake_render_backward(
        means2d,
        conics,
        a["opacities"],
        rgb,
        depths,
        a["background"],
        ranges,
        ids,
        *img[1:],
        *img[:3],
        21,
        13,
    )
    assert [tuple(g.shape) for g in grads] == [(7, 2), (7, 3), (7,), (7, 3), (7,)]
    grads = splat._fake_project_backward(
        a["means"],
        a["scales"],
        a["rotations"],
        a["sh"],
        a["viewmat"],
        a["K"],
        radii,
        means2d,
        conics,
        rgb,
        depths,
        out[8],
        out[9],
        21,
        13,
        2,
    )
    assert [tuple(g.shape) for g in grads] == [(7, 3), (7, 3), (7, 4), (7, 9, 3), (0,), (0,)]
    assert [g.dtype for g in grads] == [torch.float32] * 6
    assert splat._tiles(33, 17) == 3 * 2 and splat._tiles(1, 1) == 1


class _Ctx:
    """What the setup_context functions call on autograd's ctx, recorded."""

    def __init__(self) -> None:
        self.saved: tuple[torch.Tensor, ...] = ()
        self.materialize: bool | None = None

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        self.saved = tensors

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize = value


def test_unused_outputs_get_no_zero_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ops turn off autograd's zero-filling of the gradients the loss does not reach:
    else every backward allocates zeros shaped like radii, rects, ranges and ids (54 MiB at
    the peak of a 1M-Gaussian step) and like alpha and depth (which the render backward then
    also reads)."""
    monkeypatch.setattr(splat, "_overlaps", lambda: 11)
    a = splat_scenes.to(splat_scenes.scene(7, 21, 13, 5, sh_degree=2), "meta")
    inputs = (
        a["means"],
        a["scales"],
        a["rotations"],
        a["opacities"],
        a["sh"],
        a["viewmat"],
        a["K"],
        a["background"],
        21,
        13,
        2,
        None,
    )
    out = splat._fake_project(*inputs)
    ctx = _Ctx()
    splat._project_setup_context(ctx, inputs, out)
    assert ctx.materialize is False and ctx.saved[-1] is out[4]  # radii: all it keeps of out
    means2d, conics, rgb, depths, _, _, ranges, ids, _, _ = out
    render_inputs = (
        means2d,
        conics,
        a["opacities"],
        rgb,
        depths,
        a["background"],
        ranges,
        ids,
        21,
        13,
    )
    ctx = _Ctx()
    splat._render_setup_context(ctx, render_inputs, splat._fake_render(*render_inputs))
    assert ctx.materialize is False


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fake_impl_dtypes_of_half_parameters(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """16-bit parameters: every output of the projection float32 (int32), plus float32
    copies of the opacities and the background for render; the projection backward's
    gradients in the parameters' dtype, the opacities' and background's included."""
    monkeypatch.setattr(splat, "_overlaps", lambda: 11)
    a = splat_scenes.to(splat_scenes.scene(7, 21, 13, 5, sh_degree=3), "meta", dtype)
    assert a["means"].dtype == dtype and a["viewmat"].dtype == torch.float32
    out = splat._fake_project(
        a["means"],
        a["scales"],
        a["rotations"],
        a["opacities"],
        a["sh"],
        a["viewmat"],
        a["K"],
        a["background"],
        21,
        13,
        3,
        None,
    )
    assert [tuple(o.shape) for o in out] == [
        (7, 2),
        (7, 3),
        (7, 3),
        (7,),
        (7,),
        (7, 4),
        (2, 2),
        (11,),
        (7,),
        (3,),
    ]
    assert [o.dtype for o in out] == [torch.float32] * 4 + [torch.int32] * 4 + [torch.float32] * 2
    grads = splat._fake_project_backward(
        a["means"],
        a["scales"],
        a["rotations"],
        a["sh"],
        a["viewmat"],
        a["K"],
        out[4],
        *out[:4],
        out[8],
        out[9],
        21,
        13,
        3,
    )
    assert [tuple(g.shape) for g in grads] == [(7, 3), (7, 3), (7, 4), (7, 16, 3), (7,), (3,)]
    assert [g.dtype for g in grads] == [dtype] * 6


def _half(dtype: torch.dtype, **dtypes: torch.dtype) -> dict:
    args = splat_scenes.to(_scene(), "cpu", dtype)
    return {k: (v.to(dtypes[k]) if k in dtypes else v) for k, v in args.items()}


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            lambda: _scene(means=_scene()["means"].double()),
            r"means must be float32, bfloat16 or float16 \(the Gaussian parameters' dtype\), got "
            r"torch.float64",
        ),
        (
            lambda: _half(torch.bfloat16, rotations=torch.float32),
            r"must share one dtype \(float32, bfloat16 or float16\): means is torch.bfloat16 but "
            r"rotations is torch.float32$",
        ),
        (
            lambda: _half(torch.float16, opacities=torch.bfloat16, colors=torch.float32),
            r"means is torch.float16 but opacities is torch.bfloat16, colors is torch.float32$",
        ),
        (
            lambda: _scene(background=_scene()["background"].half()),
            r"means is torch.float32 but background is torch.float16$",
        ),
        (
            lambda: {
                **_half(torch.bfloat16),
                "colors": None,
                "sh": torch.rand(4, 4, 3, dtype=torch.float16),
            },
            r"means is torch.bfloat16 but sh is torch.float16$",
        ),
        (
            lambda: _half(torch.bfloat16, viewmat=torch.bfloat16),
            r"viewmat must be float32 \(the camera stays float32 whatever the Gaussian parameters' "
            r"dtype\), got torch.bfloat16",
        ),
        (
            lambda: _half(torch.float16, K=torch.float64),
            r"K must be float32 \(the camera stays float32 .*got torch.float64",
        ),
    ],
)
def test_dtype_errors_without_gpu(args, match) -> None:
    """The dtype rules are checked before the CPU tensors are refused (a TypeError naming
    the tensors and their dtypes)."""
    with pytest.raises(TypeError, match=match):
        splat.rasterize(**args())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_supported_dtypes_pass_the_python_checks(dtype: torch.dtype) -> None:
    """One dtype for all parameters (the camera float32): only the device is left to refuse."""
    with pytest.raises(ValueError, match=r"means must be a CUDA tensor, got one on cpu"):
        splat.rasterize(**_half(dtype))


def test_reference_gradients_match_finite_differences() -> None:
    """The oracle's autograd against central differences (float64 gradcheck) on a small scene
    with SH degree 2, a background and every differentiable input."""
    args = splat_scenes.scene(6, 12, 10, 3, sh_degree=2, log_scale=(-2.0, -1.0), spread=0.8)
    names = ("means", "scales", "rotations", "opacities", "sh", "background")
    leaves = tuple(args[k].double().requires_grad_() for k in names)
    fixed = {
        k: v.double() if isinstance(v, torch.Tensor) else v
        for k, v in args.items()
        if k not in names
    }

    def render(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = reference(**fixed, **dict(zip(names, values, strict=True)))
        return out.image, out.alpha, out.depth, out.means2d

    assert reference(**fixed, **dict(zip(names, leaves, strict=True))).radii.gt(0).sum() >= 4
    assert torch.autograd.gradcheck(render, leaves, eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=True)


def test_kernel_and_oracle_return_one_result_type() -> None:
    from gpucheck.kernels.splat.reference import RasterizeResult

    assert splat.RasterizeResult is RasterizeResult
    assert isinstance(reference(**_scene()), splat.RasterizeResult)


def test_scenes_are_what_the_suite_says() -> None:
    """Random scenes: visible Gaussians with small radii, some off-screen, all finite."""
    args = splat_scenes.scene(200, 64, 48, 11)
    res = reference(**args)
    visible = res.radii > 0
    assert 0 < int(visible.sum()) < 200
    behind = reference(**splat_scenes.scene(30, 64, 48, 12, depth_range=(-3.0, 0.2)))
    assert not bool(behind.radii.any())


# Messages of the CUDA op's failed preflight, recorded on an H200 (2026-11-24) from the splat
# suite's twice-activated scenes: a max_bytes budget, and the free device memory.
RECORDED_BUDGET = (
    "splat_project: binning budget exceeded: more than max_bytes 40000. 200 Gaussians (200 "
    "visible) touch 3200 tiles in total (16 tiles of 64x64), binning needs 76800 bytes, "
    "149460977152 bytes free; radius percentiles (visible, px) p50 77, p90 79, p99 80, max 80; "
    "200 Gaussians (100 %) cover more than 25 % of the image. Hint: scales look already "
    "exponentiated: activation applied twice? (3DGS checkpoints store log-scales; exp them "
    "exactly once)"
)
RECORDED_FREE = (
    "splat_project: binning budget exceeded: needs 315466115112 bytes with the sort's scratch, "
    "more than the 149202609664 bytes free on cuda:0. 2000000 Gaussians (2000000 visible) touch "
    "13144421463 tiles in total (8160 tiles of 1920x1080), binning needs 315466115112 bytes, "
    "149202609664 bytes free; radius percentiles (visible, px) p50 771, p90 785, p99 796, max "
    "809; 2000000 Gaussians (100 %) cover more than 25 % of the image. Hint: scales look already "
    "exponentiated: activation applied twice? (3DGS checkpoints store log-scales; exp them "
    "exactly once)"
)


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        (
            RECORDED_BUDGET,
            dict(
                n=200,
                visible=200,
                overlaps=3200,
                bytes_needed=76800,
                bytes_free=149460977152,
                large_share=1.0,
                radius_percentiles={"p50": 77, "p90": 79, "p99": 80, "max": 80},
            ),
        ),
        (
            RECORDED_FREE,
            dict(
                n=2_000_000,
                visible=2_000_000,
                overlaps=13144421463,
                bytes_needed=315466115112,
                bytes_free=149202609664,
                large_share=1.0,
                radius_percentiles={"p50": 771, "p90": 785, "p99": 796, "max": 809},
            ),
        ),
    ],
    ids=["max_bytes", "free_memory"],
)
def test_memory_anomaly_error_fields(message: str, fields: dict) -> None:
    err = gpucheck.MemoryAnomalyError(message)
    assert isinstance(err, BudgetExceeded) and str(err) == message
    assert err.exit_code == BudgetExceeded.exit_code
    for name, want in fields.items():
        assert getattr(err, name) == want, name
    assert err.hint is not None and err.hint.startswith(
        "scales look already exponentiated: activation applied twice?"
    )


def test_memory_anomaly_error_without_fields() -> None:
    """A message in another shape still makes a usable error (fields None, message kept)."""
    err = gpucheck.MemoryAnomalyError("splat_project: binning budget exceeded: something else")
    assert err.n is None and err.radius_percentiles is None and err.hint is None
    assert "something else" in str(err)
