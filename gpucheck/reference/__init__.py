"""Pure-PyTorch implementations of gpucheck's kernels, used as oracles (CPU and GPU)."""
