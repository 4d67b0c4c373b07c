"""The ``gpucheck`` command (its script, and ``python -m gpucheck`` where the script is not on
PATH). For ``gpucheck run``, the first worker's interpreter starts before anything else is
imported here (:mod:`gpucheck.controller.prestart`), then the command line is read."""

from __future__ import annotations

import sys


def main() -> int:
    """Entry point of the ``gpucheck`` script; returns the exit code."""
    from gpucheck.controller import prestart

    prestart.start(sys.argv[1:])
    from gpucheck.cli import main as cli_main  # lazy: after the worker's interpreter started

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
