"""Pure-PyTorch implementations of gpucheck's kernels, used as oracles (CPU and GPU)."""

from gpucheck.reference.knn import knn_mean_sq_dist
from gpucheck.reference.splat import RasterizeResult, rasterize
from gpucheck.reference.ssim_torch import ssim

__all__ = ["RasterizeResult", "knn_mean_sq_dist", "rasterize", "ssim"]
