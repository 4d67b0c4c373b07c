"""Pure-PyTorch SSIM: the oracle for ``gpucheck.ops.ssim`` (CPU and GPU, any float dtype).

The structural similarity index of Wang et al. (2004) with the usual 3DGS settings: an 11×11
Gaussian window with sigma 1.5 applied per channel (depthwise ``conv2d``), C1 = 0.01²,
C2 = 0.03² (images in [0, 1]). ``padding="same"`` zero-pads the images (the map is H×W);
``padding="valid"`` crops 5 pixels on each side of that map ((H-10)×(W-10)).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

#: the names gpucheck.reference exports of this kernel (gpucheck/kernels/__init__.py)
__all__ = ["ssim"]

WINDOW_SIZE = 11
SIGMA = 1.5
C1 = 0.01**2
C2 = 0.03**2
PADDINGS = ("same", "valid")
REDUCTIONS = ("mean", "none")
HALF = WINDOW_SIZE // 2


def gaussian_1d(
    dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The normalized 1-D Gaussian of the window, computed in float64.

    Returns:
        ``[11]`` tensor that sums to 1, in ``dtype`` on ``device``.
    """
    coords = torch.arange(WINDOW_SIZE, dtype=torch.float64) - HALF
    g = torch.exp(-(coords**2) / (2 * SIGMA**2))
    return (g / g.sum()).to(dtype=dtype, device=device)


def gaussian_window(channels: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """The 2-D window as a depthwise ``conv2d`` weight.

    Returns:
        ``[channels, 1, 11, 11]`` tensor, the outer product of :func:`gaussian_1d` with itself.
    """
    g = gaussian_1d()
    return (
        torch.outer(g, g)
        .to(dtype=dtype, device=device)
        .expand(channels, 1, WINDOW_SIZE, WINDOW_SIZE)
        .contiguous()
    )


def check_args(img1: torch.Tensor, img2: torch.Tensor, padding: str, reduction: str) -> None:
    """Raise ValueError/TypeError with a clear message for arguments SSIM cannot take."""
    if padding not in PADDINGS:
        raise ValueError(f"ssim: padding must be one of {PADDINGS}, got {padding!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"ssim: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    for name, t in (("img1", img1), ("img2", img2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"ssim: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"ssim: {name} must be [B, C, H, W], got shape {list(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"ssim: {name} must be a floating-point tensor, got {t.dtype}")
    if img1.shape != img2.shape:
        raise ValueError(
            f"ssim: img1 and img2 must have the same shape, got {list(img1.shape)} and "
            f"{list(img2.shape)}"
        )
    if img1.dtype != img2.dtype:
        raise TypeError(
            f"ssim: img1 and img2 must have the same dtype, got {img1.dtype} and {img2.dtype}"
        )
    if img1.device != img2.device:
        raise ValueError(f"ssim: img1 is on {img1.device} but img2 is on {img2.device}")
    if img1.numel() == 0:
        raise ValueError(f"ssim: inputs must not be empty, got shape {list(img1.shape)}")
    if padding == "valid" and min(img1.shape[-2:]) < WINDOW_SIZE:
        raise ValueError(
            f"ssim: padding='valid' needs H, W >= {WINDOW_SIZE}, got {list(img1.shape[-2:])}"
        )


def ssim(
    img1: torch.Tensor, img2: torch.Tensor, padding: str = "same", reduction: str = "mean"
) -> torch.Tensor:
    """SSIM of two image batches, computed with depthwise convolutions in their own dtype.

    Args:
        img1: ``[B, C, H, W]`` floating-point images (values nominally in [0, 1]).
        img2: ``[B, C, H, W]``, same dtype and device as ``img1``.
        padding: ``"same"`` (zero padding, map ``[B, C, H, W]``) or ``"valid"`` (map
            ``[B, C, H-10, W-10]``; needs H, W >= 11).
        reduction: ``"mean"`` (0-dim tensor, the mean of the map) or ``"none"`` (the map).

    Returns:
        The mean SSIM (0-dim) or the SSIM map, in the inputs' dtype. Differentiable.

    Raises:
        ValueError, TypeError: for shapes, dtypes, devices or options SSIM cannot take.
    """
    check_args(img1, img2, padding, reduction)
    m = moments(img1, img2)
    a1, a2, b1, b2 = _terms(m)
    ssim_map = (a1 * a2) / (b1 * b2)
    if padding == "valid":
        ssim_map = _crop(ssim_map)
    return ssim_map.mean() if reduction == "mean" else ssim_map


class Moments(NamedTuple):
    """The four windowed moments SSIM depends on (each ``[B, C, H, W]``, zero padding)."""

    mu1: torch.Tensor  #: G * x
    mu2: torch.Tensor  #: G * y
    sq: torch.Tensor  #: G * (x² + y²) (the variances enter SSIM only as their sum)
    xy: torch.Tensor  #: G * (x y)


def _filter(t: torch.Tensor) -> torch.Tensor:
    """The window applied per channel with zero padding (``[B, C, H, W]`` in, same out)."""
    channels = t.shape[1]
    window = gaussian_window(channels, t.dtype, t.device)
    return F.conv2d(t, window, padding=HALF, groups=channels)


def moments(img1: torch.Tensor, img2: torch.Tensor) -> Moments:
    """The windowed moments of two ``[B, C, H, W]`` image batches, in their dtype."""
    return Moments(
        _filter(img1),
        _filter(img2),
        _filter(img1 * img1) + _filter(img2 * img2),
        _filter(img1 * img2),
    )


def _terms(m: Moments) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SSIM = (a1 a2) / (b1 b2): luminance a1 / b1 and contrast-structure a2 / b2, with the
    variances and the covariance formed as E[x²] - mu² (what fused kernels compute)."""
    mu1_mu2 = m.mu1 * m.mu2
    mu_sq = m.mu1 * m.mu1 + m.mu2 * m.mu2
    return (2 * mu1_mu2 + C1, 2 * (m.xy - mu1_mu2) + C2, mu_sq + C1, (m.sq - mu_sq) + C2)


def _partials(m: Moments) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SSIM's partial derivatives with the variance sum and the covariance as variables:
    (dS/dmu1, dS/dmu2, dS/d(sigma1² + sigma2²), dS/dsigma12)."""
    a1, a2, b1, b2 = _terms(m)
    s = (a1 * a2) / (b1 * b2)
    lum = a2 / b2 * 2 / (b1 * b1)  # d(a1 / b1)/dmu1 = 2 (mu2 b1 - mu1 a1) / b1²
    return (
        lum * (m.mu2 * b1 - m.mu1 * a1),
        lum * (m.mu1 * b1 - m.mu2 * a1),
        -s / b2,
        2 * a1 / (b1 * b2),
    )


def _crop(t: torch.Tensor) -> torch.Tensor:
    return t[..., HALF:-HALF, HALF:-HALF]


class Sensitivity(NamedTuple):
    """Per element, how far rounding moves SSIM and its gradients, in units of u (see
    :func:`rounding_sensitivity`); float64."""

    map: torch.Tensor  #: the map's shape
    grad1: torch.Tensor | None  #: img1's shape (None without ``grad``)
    grad2: torch.Tensor | None


def rounding_sensitivity(
    img1: torch.Tensor, img2: torch.Tensor, padding: str = "same", grad: torch.Tensor | None = None
) -> Sensitivity:
    """How far rounding can move SSIM and its gradients when the variances are formed as
    E[x²] - mu², per element, in units of the arithmetic's unit roundoff u (computed in
    float64 from the images as given; a kernel's error divided by ``u`` times these is its
    constant, which a measurement over many seeds bounds: ``benchmarks/tolerances.py``).

    The variance sum b2 - C2 = G*(x² + y²) - mu1² - mu2² and the covariance cancel: their
    rounding is about u T with T = G*(x² + y²) + mu1² + mu2², which bounds every term of both
    (Cauchy-Schwarz), against b2 = sigma1² + sigma2² + C2, small where the images are smooth
    (a float32 kernel errs there by ~1e-3 on bright images in [0, 1]). With rho = T / b2 and
    |a2| <= b2, SSIM = (a1 / b1)(a2 / b2) moves by about u (|a1| / b1) rho, plus a few u of its
    own value: ``map = |SSIM| + (|a1| / b1) rho``.

    Gradients (``grad``: the loss's gradient with respect to the map, the map's shape): a
    fused kernel forms dL/dx = G*(g P1) + 2 x G*(g Pv) + y G*(g Pc) with the partials
    Pv = dS/d(sigma1² + sigma2²) = -SSIM / b2, Pc = dS/dsigma12 and
    P1 = dS/dmu1 - 2 mu1 Pv - mu2 Pc; where the images are smooth, x ~ mu1 and the terms,
    large as 1 / b2, cancel. ``grad1 = G*(|g| M1) + 2 |x| G*(|g Pv|) + |y| G*(|g Pc|)`` with
    M1 = |dS/dmu1| + 2 |mu1 Pv| + |mu2 Pc|, the magnitudes that cancel, whose rounding is
    about u times them (grad2 likewise, the images' roles swapped). Measured against float64
    (torch's float32 SSIM on CPU: noise and smooth images, 11x11 to 64x80): the L2 error is
    0.8-3 u |grad1|, once 20 (one map pixel: 11x11, padding "valid"); gpucheck's kernels on
    an H200 and an H100: <= 5.6 u |grad1|, <= 2.9 u map (benchmarks/HISTORY.md).
    """
    check_args(img1, img2, padding, "none")
    x, y = img1.double(), img2.double()
    m = moments(x, y)
    a1, a2, b1, b2 = _terms(m)
    rho = (m.sq + m.mu1 * m.mu1 + m.mu2 * m.mu2) / b2
    sens_map = ((a1 * a2) / (b1 * b2)).abs() + a1.abs() / b1 * rho
    if padding == "valid":
        sens_map = _crop(sens_map)
    if grad is None:
        return Sensitivity(sens_map, None, None)
    g = grad.double().abs()
    if padding == "valid":
        g = F.pad(g, (HALF, HALF, HALF, HALF))
    if g.shape != x.shape:
        raise ValueError(
            f"rounding_sensitivity: grad must have the map's shape, got {list(grad.shape)}"
        )
    d_mu1, d_mu2, p_var, p_cov = _partials(m)
    f_var, f_cov = _filter(g * p_var.abs()), _filter(g * p_cov.abs())
    grads = []
    for d_mu, mu, mu_other, own, other in (
        (d_mu1, m.mu1, m.mu2, x, y),
        (d_mu2, m.mu2, m.mu1, y, x),
    ):
        m_abs = d_mu.abs() + 2 * (mu * p_var).abs() + (mu_other * p_cov).abs()
        grads.append(_filter(g * m_abs) + 2 * own.abs() * f_var + other.abs() * f_cov)
    return Sensitivity(sens_map, grads[0], grads[1])
