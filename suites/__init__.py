"""gpucheck's suites, installed as ``gpucheck.suites`` (gpucheck/_resources.py)."""
