"""Processes as Linux shows them (``/proc``, the cgroup2 file system): what a worker and its
cases started, found and ended, by the worker (its children) and by the controller (what a
worker left running). Elsewhere than Linux every question here answers "none".

A process is known by its pid and its start time (:func:`start_ticks`): a pid that is
reused by an unrelated process after the first one ended is never taken for it.

Where the controller may make a cgroup (a folder of the cgroup2 file system under its own,
writable: root, or a systemd user session's delegated tree), each worker gets one
(:class:`Cgroup`) and joins it first thing: everything its cases start is in it, in a
session of its own too (``setsid``, ``start_new_session=True``, a daemon's double fork),
and ends with :meth:`Cgroup.kill`. ``GPUCHECK_NO_CGROUP=1`` leaves cgroups alone (a batch
system that accounts by cgroup and wants none made).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

#: set (to anything but 0) to make no cgroup for the workers: what they leave running is then
#: found through their children (:func:`descendants`), as they recorded them
NO_CGROUP_ENV = "GPUCHECK_NO_CGROUP"


def _stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rindex(b")") + 2 :].split()  # (comm) may hold spaces and parentheses


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None when it is gone or a
    zombie."""
    fields = _stat(pid)
    if fields is None or len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def cmdline(pid: int, limit: int = 200) -> str:
    """Process ``pid``'s command line, on one line ("" when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4 * limit)
    except OSError:
        return ""
    return " ".join(raw.replace(b"\0", b" ").decode(errors="replace").split())[:limit]


def children(pid: int) -> list[int]:
    """The running (not zombie) child processes of ``pid``: from each of its threads'
    ``children`` list where the kernel keeps one (a few small reads), else by reading every
    process of ``/proc`` for its parent."""
    listed = _listed_children(pid)
    if listed is None:
        try:
            every = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        except OSError:
            return []
        listed = [p for p in every if (f := _stat(p)) is not None and int(f[1]) == pid]
    return [p for p in listed if (f := _stat(p)) is not None and f[0] not in (b"Z", b"X")]


def _listed_children(pid: int) -> list[int] | None:
    """The pids in ``/proc/PID/task/TID/children`` of every thread of ``pid`` (a child is
    listed under the thread that started it), or None where the kernel keeps no such list
    (built without ``CONFIG_PROC_CHILDREN``, or no ``/proc``)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None if not os.path.isdir("/proc/self/task") else []
    pids: list[int] = []
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                pids += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            if os.path.isdir(f"/proc/{pid}/task/{tid}"):
                return None  # the thread is there and its list is not: no lists here
        except (OSError, ValueError):
            continue  # the thread ended while we read
    return pids


def descendants(pid: int) -> list[int]:
    """Every running process under ``pid``: its children, theirs, and so on."""
    out: list[int] = []
    todo = children(pid)
    while todo:
        p = todo.pop()
        if p not in out:
            out.append(p)
            todo += children(p)
    return out


@dataclass(frozen=True)
class Proc:
    """A process as seen once: its pid, its start time, its command line."""

    pid: int
    start: int
    cmd: str

    @classmethod
    def of(cls, pid: int) -> Proc | None:
        start = start_ticks(pid)
        return None if start is None else cls(pid, start, cmdline(pid))

    def alive(self) -> bool:
        """Still this process (the pid not reused by another since)."""
        return start_ticks(self.pid) == self.start

    def __str__(self) -> str:
        cmd = self.cmd if len(self.cmd) <= 60 else self.cmd[:59] + "…"
        return f"pid {self.pid} ({cmd or '?'})"


def end(procs: list[Proc]) -> list[Proc]:
    """SIGKILL every one of ``procs`` still running (stopped first, so that none starts
    another meanwhile), and what it started meanwhile; the ones that were ended."""
    live = [Proc(p.pid, p.start, p.cmd or cmdline(p.pid)) for p in procs if p.alive()]
    for p in live:
        with contextlib.suppress(OSError):
            os.kill(p.pid, signal.SIGSTOP)
    more = [q for p in live for d in descendants(p.pid) if (q := Proc.of(d)) is not None]
    every = list({p.pid: p for p in [*live, *more]}.values())
    for p in every:
        with contextlib.suppress(OSError):
            os.kill(p.pid, signal.SIGKILL)
    return every


# --- cgroups -----------------------------------------------------------------------------------


def _own_cgroup() -> Path | None:
    """This process's cgroup2 folder, or None (no cgroup2 file system, or not Linux)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    own = next((line[3:] for line in lines if line.startswith("0::")), None)
    # mountinfo: ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS... - FSTYPE SOURCE SUPER-OPTIONS
    point = next(
        (
            line.split()[4]
            for line in mounts
            if " - " in line and line.split(" - ", 1)[1].split()[0] == "cgroup2"
        ),
        None,
    )
    if own is None or point is None or own.startswith("/.."):
        return None
    return Path(point) / own.lstrip("/")


class Cgroup:
    """A cgroup made for one worker (or rank) under this process's own, where one can be:
    the worker joins it (:func:`join`), and :meth:`kill` ends what is left in it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls, name: str) -> Cgroup | None:
        """A fresh cgroup named ``name`` (unique to this process), or None where none can be
        made (no cgroup2, no right to write there, ``GPUCHECK_NO_CGROUP``)."""
        if os.environ.get(NO_CGROUP_ENV, "0") not in ("", "0"):
            return None
        own = _own_cgroup()
        if own is None:
            return None
        if own not in _swept:
            _swept.add(own)
            _sweep(own)
        path = own / f"gpucheck-{os.getpid()}-{name}"
        try:
            path.mkdir()
        except FileExistsError:
            pass
        except OSError:
            return None
        return cls(path)

    def procs(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill(self, wait_s: float = 2.0) -> list[Proc]:
        """End every process in the cgroup (``cgroup.kill`` where the kernel has it, Linux
        5.14; else each, frozen first), remove it; the processes that were in it."""
        found = [p for pid in self.procs() if (p := Proc.of(pid)) is not None]
        if found:
            try:
                (self.path / "cgroup.kill").write_text("1")
            except OSError:
                with contextlib.suppress(OSError):
                    (self.path / "cgroup.freeze").write_text("1")
                end(found)
                with contextlib.suppress(OSError):
                    (self.path / "cgroup.freeze").write_text("0")
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # the processes are still dying
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        return found


#: the cgroup folders swept already by this process (:func:`_sweep`, once each)
_swept: set[Path] = set()


def _sweep(own: Path) -> None:
    """End and remove the cgroups that gpucheck runs which are gone left in ``own``: a run
    SIGKILLed (its workers die with it, by the kernel's parent-death signal) leaves its
    workers' cgroups, and what their cases started in sessions of their own in them. A
    cgroup names the run's pid; one whose pid runs (that run, or another process since) is
    left alone."""
    for path in own.glob("gpucheck-*-*"):
        pid = path.name.split("-")[1]
        if pid.isdigit() and start_ticks(int(pid)) is None:
            Cgroup(path).kill(wait_s=0.5)


def join(path: str) -> bool:
    """Move this process into the cgroup at ``path`` (before it starts anything); False when
    it cannot (another user's, a controller's file system that refuses)."""
    try:
        with open(Path(path) / "cgroup.procs", "w") as f:
            f.write("0")
    except OSError:
        return False
    return True
