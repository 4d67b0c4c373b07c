"""The ``gpucheck`` command (its script, and ``python -m gpucheck`` where the script is not on
PATH). For ``gpucheck run``, the first worker's interpreter starts before anything else is
imported here (:mod:`gpucheck.controller.prestart`), then the command line is read. The
command ends as its workers do (:func:`gpucheck.worker.quick_exit.end`): its threads and
``atexit`` handlers done, without the interpreter's teardown of every module it imported."""

from __future__ import annotations

import sys
from typing import NoReturn


def main() -> NoReturn:
    """Entry point of the ``gpucheck`` script: runs the command and ends the process with its
    exit code (2 at once, in one sentence, where another distribution's ``gpucheck`` module
    is installed over this one: :func:`gpucheck._distribution.conflict`)."""
    from gpucheck import _distribution

    problem = _distribution.conflict()
    if problem is not None:
        from gpucheck.errors import EXIT_USAGE

        print(f"gpucheck: {problem}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    from gpucheck.controller import prestart

    prestart.start(sys.argv[1:])
    from gpucheck.cli import main as cli_main  # lazy: after the worker's interpreter started
    from gpucheck.worker.quick_exit import end

    end(cli_main())


if __name__ == "__main__":
    sys.exit(main())
