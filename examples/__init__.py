"""gpucheck's worked examples, installed as ``gpucheck.examples`` (gpucheck/_resources.py)."""
