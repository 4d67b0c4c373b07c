"""``python -m gpucheck``: the ``gpucheck`` command, for where its script is not on PATH."""

import sys

from gpucheck.cli import main

if __name__ == "__main__":
    sys.exit(main())
