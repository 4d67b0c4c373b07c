"""Typed Python wrappers of gpucheck's reference CUDA kernels (``torch.ops.gpucheck.*``).

Importing works without the compiled extension; it is loaded on the first call.
"""

from gpucheck.ops.knn import knn_mean_sq_dist
from gpucheck.ops.splat import rasterize
from gpucheck.ops.ssim_op import ssim

__all__ = ["knn_mean_sq_dist", "rasterize", "ssim"]
