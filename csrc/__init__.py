"""gpucheck's CUDA sources, installed as ``gpucheck.csrc`` (gpucheck/_resources.py)."""
