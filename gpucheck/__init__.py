"""gpucheck: find the bugs of PyTorch CUDA extensions that only show on the second GPU,
inside backward, under mixed precision or after a checkpoint resume."""

__version__ = "0.1.0"

from gpucheck.errors import MemoryAnomalyError

__all__ = ["MemoryAnomalyError", "__version__"]
