"""The end of a harness worker's process once pytest has returned: no interpreter teardown.

When pytest returns, everything the worker writes is written: its records and state file (the
plugin closes them at unconfigure), pytest's own output. What a normal interpreter exit does
after that is ending the threads that are not daemons (``threading``'s shutdown) and running
the ``atexit`` handlers (both done here, in that order), then tearing down every module and
object and, where CUDA was used, freeing the caching allocator's blocks and the context one
call at a time: seconds on a GPU (0.08 s for an idle CPU process), which the end of the
process does at once. :func:`end` does the first two and ends the process with ``os._exit``
and pytest's exit code.

The controller starts workers this way where nothing needs that teardown
(:func:`gpucheck.controller.spawning.worker_command`): not under compute-sanitizer (its leak
report comes from the context's teardown), not for distributed ranks (their process groups
end there). The ``gpucheck`` command itself ends this way too (:mod:`gpucheck.__main__`: its
reports are written and closed by then; the teardown of click, rich, jinja and the rest took
~0.03 s of every command). What a test leaves open at the end (a file it never closed) is
not flushed then.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def end(code: int) -> NoReturn:
    """What the interpreter's exit does first, as it does it — ``threading``'s own shutdown
    (its exit hooks, which tell idle pools such as a ``ThreadPoolExecutor`` left open to end,
    then the joins of the non-daemon threads), the ``atexit`` handlers — then flush and exit
    with ``code``."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()
    os._exit(int(code))
