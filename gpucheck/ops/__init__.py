"""Typed Python wrappers of gpucheck's reference CUDA kernels (``torch.ops.gpucheck.*``)."""
