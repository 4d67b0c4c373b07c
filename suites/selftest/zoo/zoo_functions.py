"""The zoo's extensions as their users call them: each ``PYBIND11_MODULE`` (zoo_<family>.cpp /
.cu, built by ``gpucheck._csrc.zoo.build_zoo``) from a ``torch.autograd.Function`` the way the
field's Python wrappers do (diff-gaussian-rasterization's ``_RasterizeGaussians``, fused-ssim,
simple-knn's ``distCUDA2``, RWKV's ``WKV``), and the pure-PyTorch references the cases check
them against (float64, on the CPU).

Defect builds may launch on stream 0, unordered with the caller's stream: each call is
bracketed by ``torch.cuda.synchronize`` (:func:`_ready`) so that results are right anyway; the
detectors look at streams, not at results.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

#: an empty tensor for "not given", as the 3DGS wrappers pass it
PLACEHOLDER = torch.Tensor([])
SH_C0 = 0.28209479177387814
#: zoo_raster.cu's weight: exp(power) - CUT, clamped to [0, 0.99]; NEAR: its culling depth;
#: TILE: its tiles' side in pixels
CUT, NEAR, TILE = math.exp(-0.5 * 3.3**2), 0.2, 16


def _ready(*tensors: torch.Tensor) -> None:
    for device in {t.device for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda}:
        torch.cuda.synchronize(device)


# --- rasterizer (diff-gaussian-rasterization's shape) ----------------------------------------


class _RasterizeGaussians(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        ext: Any,
        means2D: torch.Tensor,
        depths: torch.Tensor,
        sigmas: torch.Tensor,
        opacities: torch.Tensor,
        colors_precomp: torch.Tensor,
        sh_dc: torch.Tensor,
        background: torch.Tensor,
        height: int,
        width: int,
        tile_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        args = (background, means2D, depths, sigmas, opacities, colors_precomp, sh_dc)
        _ready(*args)
        num_rendered, color, radii, geom, binning, img, alpha, last_ids = ext.rasterize_gaussians(
            *args, height, width, tile_mask
        )
        _ready(color, geom)
        ctx.ext, ctx.num_rendered = ext, num_rendered
        ctx.save_for_backward(*args, geom, binning, img, tile_mask)
        ctx.mark_non_differentiable(radii, last_ids)
        return color, radii, alpha, last_ids

    @staticmethod
    def backward(
        ctx: Any, grad_color: torch.Tensor, _grad_radii: Any, _grad_alpha: Any, _grad_last: Any
    ) -> tuple[Any, ...]:
        # the alpha depends on no color: its gradient reaches nothing differentiated here
        (
            background,
            means2D,
            depths,
            sigmas,
            opacities,
            colors_precomp,
            sh_dc,
            geom,
            binning,
            img,
            tile_mask,
        ) = ctx.saved_tensors
        _ready(grad_color, geom)
        dL_dcolors, dL_dsh = ctx.ext.rasterize_gaussians_backward(
            background,
            means2D,
            depths,
            sigmas,
            opacities,
            colors_precomp,
            sh_dc,
            grad_color,  # as autograd hands it (the extension makes it contiguous)
            ctx.num_rendered,
            geom,
            binning,
            img,
            tile_mask,
        )
        _ready(dL_dcolors, dL_dsh)
        return (
            None,
            None,
            None,
            None,
            None,
            dL_dcolors if colors_precomp.numel() else None,
            dL_dsh if sh_dc.numel() else None,
            None,
            None,
            None,
            None,
        )


def rasterize_with_alpha(
    ext: Any,
    means2D: torch.Tensor,
    depths: torch.Tensor,
    sigmas: torch.Tensor,
    opacities: torch.Tensor,
    background: torch.Tensor,
    height: int,
    width: int,
    *,
    colors: torch.Tensor | None = None,
    sh_dc: torch.Tensor | None = None,
    tile_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(image [3, H, W], alpha [H, W], radii [P]) of P projected Gaussians (``means2D`` [P, 2]
    pixels, ``depths`` [P], ``sigmas`` [P] pixels, ``opacities`` [P, 1]) with either
    ``colors`` [P, 3] or degree-0 SH ``sh_dc`` [P, 3]; differentiable in the colors given.
    ``tile_mask`` [ceil(H / TILE), ceil(W / TILE)] bool: the tiles rendered (the others hold
    the background, alpha 0)."""
    if (colors is None) == (sh_dc is None):
        raise ValueError("give exactly one of colors and sh_dc")
    color, radii, alpha, _last = _RasterizeGaussians.apply(
        ext,
        means2D,
        depths,
        sigmas,
        opacities,
        PLACEHOLDER if colors is None else colors,
        PLACEHOLDER if sh_dc is None else sh_dc,
        background,
        height,
        width,
        PLACEHOLDER if tile_mask is None else tile_mask,
    )
    return color, alpha, radii


def rasterize(ext: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(image [3, H, W], radii [P]): :func:`rasterize_with_alpha` (its arguments) of every tile."""
    image, _alpha, radii = rasterize_with_alpha(ext, *args, **kwargs)
    return image, radii


def project_gaussians(
    ext: Any,
    means3D: torch.Tensor,
    log_scales: torch.Tensor,
    focal: float,
    height: int,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(means2D [P, 2], depths [P], conics [P, 3], radii [P]) of Gaussians at ``means3D``
    [P, 3] with ``log_scales`` [P, 3] through zoo_raster.cu's pinhole camera (the shape of
    gsplat's projection): where radii is 0 the Gaussian is culled and its other entries hold
    whatever the memory held."""
    _ready(means3D, log_scales)
    out = ext.project_gaussians(means3D, log_scales, focal, height, width)
    _ready(*out)
    return out  # type: ignore[no-any-return]


def pixel_mask(tile_mask: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[H, W] bool: the pixels of the tiles ``tile_mask`` renders."""
    return tile_mask.repeat_interleave(TILE, 0).repeat_interleave(TILE, 1)[:height, :width].bool()


def render_reference(*args: Any, **kwargs: Any) -> torch.Tensor:
    """The image of :func:`render_reference_alpha` (its arguments)."""
    image, _alpha = render_reference_alpha(*args, **kwargs)
    return image


def render_reference_alpha(
    means2D: torch.Tensor,
    depths: torch.Tensor,
    sigmas: torch.Tensor,
    opacities: torch.Tensor,
    colors: torch.Tensor,
    background: torch.Tensor,
    height: int,
    width: int,
    tile_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(image [3, H, W], alpha [H, W]) of zoo_raster.cu in float64 on the CPU: every Gaussian
    in front of NEAR, front to back by depth, blended into every pixel (differentiable in
    ``colors`` [P, 3]); the tiles ``tile_mask`` leaves out hold the background and alpha 0."""
    f = {
        n: t.detach().double().cpu()
        for n, t in dict(m=means2D, d=depths, s=sigmas, o=opacities.reshape(-1)).items()
    }
    colors = colors.double().cpu()
    ys, xs = torch.meshgrid(
        torch.arange(height, dtype=torch.float64),
        torch.arange(width, dtype=torch.float64),
        indexing="ij",
    )
    T = torch.ones(height, width, dtype=torch.float64)
    image = torch.zeros(3, height, width, dtype=torch.float64)
    for i in torch.argsort(f["d"], stable=True).tolist():
        if not f["d"][i] > NEAR:
            continue
        d2 = (xs - f["m"][i, 0]) ** 2 + (ys - f["m"][i, 1]) ** 2
        alpha = (f["o"][i] * (torch.exp(-0.5 * d2 / f["s"][i] ** 2) - CUT).clamp(min=0)).clamp(
            max=0.99
        )
        image = image + colors[i][:, None, None] * (alpha * T)
        T = T * (1 - alpha)
    bg = background.double().cpu()[:, None, None]
    image = image + T * bg
    alpha = 1 - T
    if tile_mask is not None:
        inside = pixel_mask(tile_mask.cpu(), height, width)
        image = torch.where(inside, image, bg.expand_as(image))
        alpha = torch.where(inside, alpha, 0.0)
    return image, alpha


def sh_colors(sh_dc: torch.Tensor) -> torch.Tensor:
    """The colors of degree-0 SH coefficients, as the rasterizer computes them."""
    return (0.5 + SH_C0 * sh_dc).clamp(min=0)


# --- 3DGS checkpoints read the 3DGS way, projected for the rasterizer -------------------------


def load_3dgs(path: Path) -> dict[str, torch.Tensor]:
    """The raw fields of a 3DGS checkpoint, read as 3DGS reads them: ``GaussianModel.load_ply``
    (``plyfile.PlyData.read``) or ``restore(torch.load(chkpnt)[0])``."""
    import numpy as np

    if path.suffix == ".ply":
        import plyfile

        v = plyfile.PlyData.read(str(path)).elements[0]

        def cols(*names: str) -> torch.Tensor:
            return torch.tensor(
                np.stack([np.asarray(v[n]) for n in names], axis=1), dtype=torch.float
            )

        return {
            "xyz": cols("x", "y", "z"),
            "f_dc": cols("f_dc_0", "f_dc_1", "f_dc_2"),
            "scaling": cols("scale_0", "scale_1", "scale_2"),
            "opacity": cols("opacity"),
        }
    (model_params, _first_iter) = torch.load(path)
    (_degree, xyz, f_dc, _f_rest, scaling, _rotation, opacity, *_state) = model_params
    return {
        "xyz": xyz,
        "f_dc": f_dc.reshape(-1, 3),
        "scaling": scaling,
        "opacity": opacity.reshape(-1, 1),
    }


def project(
    fields: dict[str, torch.Tensor], focal: float, height: int, width: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """Activate the raw fields as 3DGS does (exp, sigmoid) and project them through a pinhole
    camera at the origin looking along +z: the rasterizer's inputs on ``device``."""
    xyz = fields["xyz"].float()
    z = xyz[:, 2]
    scales = torch.exp(fields["scaling"].float())
    out = {
        "means2D": torch.stack(
            [focal * xyz[:, 0] / z + width / 2, focal * xyz[:, 1] / z + height / 2], 1
        ),
        "depths": z,
        "sigmas": (focal * scales.mean(1) / z.clamp(min=NEAR)).clamp(max=1e4),
        "opacities": torch.sigmoid(fields["opacity"].float()).reshape(-1, 1),
        "sh_dc": fields["f_dc"].float().reshape(-1, 3),
    }
    return {k: v.to(device).contiguous() for k, v in out.items()}


# --- SSIM loss (fused-ssim's shape) -----------------------------------------------------------

C1, C2 = 0.01**2, 0.03**2


class _FusedSSIMMap(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, ext: Any, img1: torch.Tensor, img2: torch.Tensor, train: bool
    ) -> torch.Tensor:
        _ready(img1, img2)
        ssim_map, dm_dmu1, dm_dsigma1_sq, dm_dsigma12 = ext.fusedssim(C1, C2, img1, img2, train)
        _ready(ssim_map, img1)
        ctx.ext = ext
        if train:
            ctx.save_for_backward(img1.detach(), img2, dm_dmu1, dm_dsigma1_sq, dm_dsigma12)
        return ssim_map  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, dL_dmap: torch.Tensor) -> tuple[Any, ...]:
        img1, img2, dm_dmu1, dm_dsigma1_sq, dm_dsigma12 = ctx.saved_tensors
        dL_dmap = dL_dmap.contiguous()
        _ready(dL_dmap, img1)
        grad = ctx.ext.fusedssim_backward(
            C1, C2, img1, img2, dL_dmap, dm_dmu1, dm_dsigma1_sq, dm_dsigma12
        )
        _ready(grad)
        return None, grad, None, None


def fused_ssim(
    ext: Any, img1: torch.Tensor, img2: torch.Tensor, train: bool = True
) -> torch.Tensor:
    """The mean SSIM of ``img1`` against ``img2`` ([B, C, H, W] float32), differentiable in
    ``img1`` when ``train``; in evaluation the extension returns placeholders for the maps
    the backward would need."""
    return _FusedSSIMMap.apply(ext, img1, img2, train).mean()  # type: ignore[no-any-return]


def ssim_reference(img1: torch.Tensor, img2: torch.Tensor) -> torch.Tensor:
    """The mean SSIM in float64 on the CPU (11x11 Gaussian window, sigma 1.5, zero padding),
    differentiable in ``img1``."""
    channels = img1.shape[1]
    g = torch.exp(-(torch.arange(-5, 6, dtype=torch.float64) ** 2) / (2 * 1.5**2))
    g = g / g.sum()
    window = (g[:, None] * g[None, :]).expand(channels, 1, 11, 11).contiguous()

    def blur(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(x, window, padding=5, groups=channels)

    x, y = img1.double().cpu(), img2.double().cpu()
    mu1, mu2 = blur(x), blur(y)
    s1, s2, s12 = blur(x * x) - mu1**2, blur(y * y) - mu2**2, blur(x * y) - mu1 * mu2
    ssim_map = ((2 * mu1 * mu2 + C1) * (2 * s12 + C2)) / ((mu1**2 + mu2**2 + C1) * (s1 + s2 + C2))
    return ssim_map.mean()


# --- distCUDA2 (simple-knn's shape) -----------------------------------------------------------


class _DistCUDA2(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ext: Any, points: torch.Tensor) -> torch.Tensor:
        _ready(points)
        dist = ext.distCUDA2(points)
        _ready(dist)
        ctx.mark_non_differentiable(dist)
        return dist  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        return None, None


def dist_cuda2(ext: Any, points: torch.Tensor) -> torch.Tensor:
    """[N] mean squared distance of each point of ``points`` [N, 3] to its 3 nearest."""
    return _DistCUDA2.apply(ext, points)  # type: ignore[no-any-return]


def dist_reference(points: torch.Tensor) -> torch.Tensor:
    p = points.double().cpu()
    d2 = ((p[:, None, :] - p[None, :, :]) ** 2).sum(-1)
    d2.fill_diagonal_(math.inf)
    return d2.topk(3, dim=1, largest=False).values.mean(1)


# --- custom RNN (RWKV-4's WKV shape) ----------------------------------------------------------


class _WKV(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        ext: Any,
        B: int,
        T: int,
        C: int,
        w: torch.Tensor,
        u: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        h0: torch.Tensor,
    ) -> torch.Tensor:
        y = torch.empty((B, T, C), device=w.device, memory_format=torch.contiguous_format)
        _ready(w, u, k, v, h0)
        ext.forward(B, T, C, w, u, k, v, h0, y)
        _ready(y)
        ctx.ext, ctx.shape = ext, (B, T, C)
        ctx.save_for_backward(w, u, k, v, h0, y)
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        B, T, C = ctx.shape
        w, u, k, v, h0, y = ctx.saved_tensors
        gy = gy.contiguous()
        opts = {"device": gy.device, "memory_format": torch.contiguous_format}
        gw, gu, gh0 = (torch.empty((B, C), **opts) for _ in range(3))
        gk, gv = (torch.empty((B, T, C), **opts) for _ in range(2))
        _ready(gy, w)
        ctx.ext.backward(B, T, C, w, u, k, v, h0, y, gy, gw, gu, gk, gv, gh0)
        _ready(gw)
        return (
            None,
            None,
            None,
            None,
            gw.sum(0),
            gu.sum(0),
            gk,
            gv,
            gh0 if ctx.needs_input_grad[8] else None,
        )


def wkv(
    ext: Any,
    w: torch.Tensor,
    u: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    h0: torch.Tensor | None = None,
) -> torch.Tensor:
    """y [B, T, C] of the recurrence of zoo_rnn.cu (``w``, ``u`` [C]; ``k``, ``v`` [B, T, C];
    ``h0`` [B, C] or None for zeros), differentiable in every tensor."""
    B, T, C = k.shape
    return _WKV.apply(
        ext,
        B,
        T,
        C,
        w,
        u,
        k,
        v,  # type: ignore[no-any-return]
        torch.empty(0) if h0 is None else h0,
    )


def wkv_reference(
    w: torch.Tensor,
    u: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    h0: torch.Tensor | None = None,
) -> torch.Tensor:
    """zoo_rnn.cu's recurrence in float64 on the CPU (differentiable in its inputs)."""
    w, u, k, v = (t.double().cpu() for t in (w, u, k, v))
    a = torch.exp(-torch.exp(w))
    h = (
        torch.zeros(k.shape[0], k.shape[2], dtype=torch.float64)
        if h0 is None
        else h0.double().cpu()
    )
    ys = []
    for t in range(k.shape[1]):
        z = k[:, t] * v[:, t]
        h = a * h + z
        ys.append(h + u * z)
    return torch.stack(ys, 1)
