"""Ray's own output off the console of ``gpucheck run --ray``: the lines Ray forwards from
its tasks (colour codes and all, each node's once or twice), its warnings, and what its C++
core writes when a node goes (raylet state, "Check failed ... Broken pipe") go to the run
folder's ``ray.log``, and the console holds gpucheck's lines, its verdict last.

While the run talks to the cluster, this process's descriptors 1 and 2 (where Ray's Python
and C++ write, and where its processes started here inherit them) point at a log: a
temporary file until the run folder exists (a run refused before it is made writes none),
then ``ray.log`` in it, the earlier lines copied there first. The run's console writes to the
terminal (or file) that stdout was before (:attr:`FleetOutput.console`); everything is put
back when the run ends, Ray's own end (its last forwarded lines) still into the log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO


class FleetOutput:
    """A context: inside it, descriptors 1 and 2 go to the log and :attr:`console` to what
    stdout was."""

    def __init__(self) -> None:
        self.log: IO[bytes] | None = None
        self.saved: tuple[int, int] | None = None
        self.console: IO[str] = sys.stdout
        self.path: Path | None = None

    def __enter__(self) -> FleetOutput:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        self.saved = (os.dup(1), os.dup(2))
        self.console = os.fdopen(os.dup(self.saved[0]), "w", buffering=1, errors="replace")
        self.log = tempfile.TemporaryFile()
        self._point(self.log)
        return self

    def _point(self, log: IO[bytes]) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)

    def into(self, path: Path) -> None:
        """From now on the log is ``path`` (the run folder's), what was logged before first."""
        if self.log is None or self.path is not None:
            return
        try:
            target = open(path, "ab")  # noqa: SIM115 - held until the context ends
        except OSError:
            return  # the folder cannot take it: the temporary log goes on
        self._point(target)
        self.log.seek(0)
        shutil.copyfileobj(self.log, target)
        target.flush()
        self.log.close()
        self.log, self.path = target, path

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for stream in (sys.stdout, sys.stderr, self.console):
            with contextlib.suppress(Exception):
                stream.flush()
        if self.saved is not None:
            os.dup2(self.saved[0], 1)
            os.dup2(self.saved[1], 2)
            for fd in self.saved:
                os.close(fd)
            self.saved = None
        with contextlib.suppress(Exception):
            self.console.close()
        if self.log is not None:
            self.log.close()
