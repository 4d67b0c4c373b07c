"""Pure-PyTorch SSIM: the oracle for ``gpucheck.ops.ssim`` (CPU and GPU, any float dtype).

The structural similarity index of Wang et al. (2004) with the usual 3DGS settings: an 11×11
Gaussian window with sigma 1.5 applied per channel (depthwise ``conv2d``), C1 = 0.01²,
C2 = 0.03² (images in [0, 1]). ``padding="same"`` zero-pads the images (the map is H×W);
``padding="valid"`` crops 5 pixels on each side of that map ((H-10)×(W-10)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

WINDOW_SIZE = 11
SIGMA = 1.5
C1 = 0.01**2
C2 = 0.03**2
PADDINGS = ("same", "valid")
REDUCTIONS = ("mean", "none")
HALF = WINDOW_SIZE // 2


def gaussian_1d(dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu"
                ) -> torch.Tensor:
    """The normalized 1-D Gaussian of the window, computed in float64.

    Returns:
        ``[11]`` tensor that sums to 1, in ``dtype`` on ``device``.
    """
    coords = torch.arange(WINDOW_SIZE, dtype=torch.float64) - HALF
    g = torch.exp(-(coords**2) / (2 * SIGMA**2))
    return (g / g.sum()).to(dtype=dtype, device=device)


def gaussian_window(channels: int, dtype: torch.dtype, device: torch.device | str
                    ) -> torch.Tensor:
    """The 2-D window as a depthwise ``conv2d`` weight.

    Returns:
        ``[channels, 1, 11, 11]`` tensor, the outer product of :func:`gaussian_1d` with itself.
    """
    g = gaussian_1d()
    return torch.outer(g, g).to(dtype=dtype, device=device).expand(
        channels, 1, WINDOW_SIZE, WINDOW_SIZE
    ).contiguous()


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
        raise TypeError(f"ssim: img1 and img2 must have the same dtype, got {img1.dtype} and "
                        f"{img2.dtype}")
    if img1.device != img2.device:
        raise ValueError(f"ssim: img1 is on {img1.device} but img2 is on {img2.device}")
    if img1.numel() == 0:
        raise ValueError(f"ssim: inputs must not be empty, got shape {list(img1.shape)}")
    if padding == "valid" and min(img1.shape[-2:]) < WINDOW_SIZE:
        raise ValueError(
            f"ssim: padding='valid' needs H, W >= {WINDOW_SIZE}, got {list(img1.shape[-2:])}"
        )


def ssim(img1: torch.Tensor, img2: torch.Tensor, padding: str = "same",
         reduction: str = "mean") -> torch.Tensor:
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
    channels = img1.shape[1]
    window = gaussian_window(channels, img1.dtype, img1.device)

    def filt(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, window, padding=HALF, groups=channels)

    mu1 = filt(img1)
    mu2 = filt(img2)
    mu1_sq = mu1 * mu1
    mu2_sq = mu2 * mu2
    mu1_mu2 = mu1 * mu2
    sigma1_sq = filt(img1 * img1) - mu1_sq
    sigma2_sq = filt(img2 * img2) - mu2_sq
    sigma12 = filt(img1 * img2) - mu1_mu2
    ssim_map = ((2 * mu1_mu2 + C1) * (2 * sigma12 + C2)) / (
        (mu1_sq + mu2_sq + C1) * (sigma1_sq + sigma2_sq + C2)
    )
    if padding == "valid":
        ssim_map = ssim_map[..., HALF:-HALF, HALF:-HALF]
    return ssim_map.mean() if reduction == "mean" else ssim_map


__all__ = ["C1", "C2", "SIGMA", "WINDOW_SIZE", "gaussian_1d", "gaussian_window", "ssim"]

