"""What the head of a ``gpucheck run --ray`` holds (Ray actors there) and how a node reaches
it: the records' stream (:class:`Collector`, taken into the run folder by
:func:`write_batches`) and a distributed group's meeting point (:class:`Board`, which each
node's harness meets through a :class:`RayMeeting`). Ray is imported only when a Ray run
calls it (:func:`ray_module`)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpucheck.controller.dist_group import Meeting
from gpucheck.errors import EnvironmentProblem
from gpucheck.model.layout import RunFolder, open_regular


def ray_module() -> Any:
    """Ray, or one sentence saying how to install it."""
    try:
        import ray
    except ImportError as err:
        raise EnvironmentProblem(
            '--ray needs Ray, which is not installed: python -m pip install "ray[client]>=2.40"'
        ) from err
    return ray


class Collector:
    """The records' stream from the nodes to this controller (a Ray actor on the head): keeps
    each batch of complete lines a node sends until this process takes them
    (:meth:`take`) and appends them to its run folder. The folder is this process's, on the
    machine that runs ``gpucheck run --ray``, which need not be a node of the cluster (a Ray
    Client, ``ray://``)."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, bytes]] = []

    def append(self, kind: str, data: bytes) -> None:
        self.batches.append((kind, data))

    def take(self) -> list[tuple[str, bytes]]:
        """The batches sent since the last take, in order."""
        out, self.batches = self.batches, []
        return out


def write_batches(folder: RunFolder, batches: Iterable[tuple[str, bytes]]) -> None:
    """Append each batch of lines (:meth:`Collector.take`) to the run folder's file of its
    kind (results, re-runs, NVML timeline), whole lines in one write each."""
    paths = {"results": folder.results, "rerun": folder.rerun, "timeline": folder.timeline}
    for kind, data in batches:
        fd = os.open(paths[kind], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)


class Board:
    """Where a distributed group's owners meet (a Ray actor on the head): the group's files
    by name, as each node's harness last sent them, and why the run stopped the group."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.why: str | None = None

    def put(self, files: dict[str, bytes]) -> None:
        self.files.update(files)

    def get(self, names: list[str]) -> tuple[dict[str, bytes], str | None]:
        return {n: self.files[n] for n in names if n in self.files}, self.why

    def create(self, name: str, data: bytes) -> bool:
        if name in self.files:
            return False
        self.files[name] = data
        return True

    def halt(self, why: str) -> None:
        self.why = self.why or why


#: the most of one file a node sends to the board (a rank's stderr can be long; its tail)
BOARD_FILE_MAX = 4 << 20


class RayMeeting(Meeting):
    """A node's harness meeting the other nodes' through the head's :class:`Board`: the
    files it pushes are sent by name (as they changed), those it pulls written into its
    own run folder, where the harness reads them as it reads its own ranks'."""

    def __init__(self, board: Any) -> None:
        self.board = board
        self.sent: dict[str, tuple[int, int]] = {}
        self.why: str | None = None

    def push(self, paths: Iterable[Path]) -> None:
        files = {}
        for path in paths:
            f = open_regular(path)
            if f is None:
                continue
            with f:
                st = os.fstat(f.fileno())
                if self.sent.get(path.name) == (st.st_size, st.st_mtime_ns):
                    continue
                f.seek(max(0, st.st_size - BOARD_FILE_MAX))
                files[path.name] = f.read()
            self.sent[path.name] = (st.st_size, st.st_mtime_ns)
        if files:
            self.board.put.remote(files)  # calls of one caller run in order: no wait

    def pull(self, paths: Iterable[Path]) -> None:
        wanted = {p.name: p for p in paths}
        got, self.why = ray_module().get(self.board.get.remote(list(wanted)))
        for name, data in got.items():
            path = wanted[name]
            f = open_regular(path)
            if f is not None:
                with f:
                    if f.read() == data:
                        continue
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".pull")
            tmp.write_bytes(data)
            os.replace(tmp, path)

    def create(self, path: Path, data: bytes) -> bool:
        if not ray_module().get(self.board.create.remote(path.name, data)):
            return False
        path.write_bytes(data)
        return True

    def stopped(self) -> str | None:
        return self.why
