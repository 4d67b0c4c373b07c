"""``python -m gpucheck._csrc``: the compile-only check of every CUDA source."""

import sys

from gpucheck._csrc.compile_check import main

sys.exit(main())
