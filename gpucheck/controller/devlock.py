"""One ``gpucheck run`` per GPU at a time: a lock per target device, held for the whole run.

Two runs on one GPU measure each other: memory peaks and leaks, the stray-context check (a
context of another process on the target), timings and hang limits all go wrong, without a
word. On a CI runner two jobs may well land on one machine. So a run takes, before it makes its
folder, an exclusive ``flock`` on one file per target GPU (named by its UUID, the same
whatever ``CUDA_VISIBLE_DEVICES`` calls it) and, when it resumes a run, one on that run folder
(a ``--resume`` of a run that is still going would record its cases twice).

By default a run that finds one taken stops at once, before anything runs, with one line that
names the other run (its pid, host, start and run folder): exit 2. ``--wait-for-devices
SECONDS`` (or ``GPUCHECK_WAIT_FOR_DEVICES``) queues it instead, with one line saying for whom
it waits, and stops with that line after SECONDS. The kernel drops a lock with the process
that held it, however it ended (SIGKILL too): no stale lock is ever left to clean up.

The lock files live in ``$GPUCHECK_LOCK_DIR`` (default ``<tmp>/gpucheck-locks``, writable by
every user): runs see each other where they see that folder (one machine, one container; a
shared folder for runs in different containers on one host). Where it cannot be used, the run
goes on unlocked and says so in a note. ``--cpu-only`` runs lock no device.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucheck.errors import EnvironmentProblem
from gpucheck.model import clock

#: where the lock files are (default: <tmp>/gpucheck-locks)
LOCK_DIR_ENV = "GPUCHECK_LOCK_DIR"
#: seconds between two tries of a run that waits
POLL_S = 0.5
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class DevicesBusy(EnvironmentProblem):
    """A target device (or the run folder to resume) is held by another gpucheck run."""


@dataclass(frozen=True)
class Wanted:
    what: str  # "cuda:0 (GPU-8c1e...)" or "the run folder /x/out"
    path: Path
    device: bool


def lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "gpucheck-locks")


def folder_lock(folder: Path) -> Wanted:
    key = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:16]
    return Wanted(f"the run folder {folder}", lock_dir() / f"run-{key}.lock", False)


def wanted(
    targets: Sequence[tuple[str, Any, str | None, Any]], resume: Path | None
) -> list[Wanted]:
    """The locks a run on ``targets`` (label, index, UUID, name) needs: one per GPU (by UUID),
    and the run folder it resumes; sorted, so that waiting runs never hold one each."""
    where = lock_dir()
    out = [
        Wanted(f"{label} ({uuid})", where / f"{_UNSAFE.sub('_', uuid)}.lock", True)
        for label, _, uuid, _ in targets
        if uuid
    ]
    if resume is not None:
        out.append(folder_lock(resume))
    return sorted(out, key=lambda w: str(w.path))


class Held:
    """The locks a run holds (released by :meth:`release`, or by the process's end)."""

    def __init__(self, notes: list[str]) -> None:
        self.notes = notes
        self.held: list[tuple[int, Wanted]] = []
        self.usable = True  # False once the lock folder could not be used (said in a note)
        self.folder = False  # whether the run folder's lock is among them
        self.info: dict[str, Any] = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": clock.now("seconds"),
            "out": None,
            "command": " ".join(["gpucheck", *sys.argv[1:]])[:300],
        }

    def take(self, locks: list[Wanted], wait_s: float) -> None:
        """Take every lock of ``locks``, waiting up to ``wait_s`` for those another run
        holds; :class:`DevicesBusy` when they stay taken."""
        if not locks or not self.usable:
            return
        try:
            _lock_folder(locks[0].path.parent)
            deadline = time.monotonic() + wait_s
            said = False
            while (busy := self._try(locks)) is not None:
                want, who = busy
                if time.monotonic() >= deadline:
                    raise DevicesBusy(_refusal(want, who, wait_s))
                if not said:
                    print(
                        f"gpucheck: waiting up to {wait_s:g} s for {want.what}, in use by "
                        f"another gpucheck run ({who})",
                        file=sys.stderr,
                        flush=True,
                    )
                    said = True
                time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        except OSError as err:
            self.release()
            self.usable = False
            self.notes.append(
                f"device lock not taken ({lock_dir()}: {err.strerror or err}): "
                f"another gpucheck run on the same GPUs or folder would not be "
                f"kept out (set {LOCK_DIR_ENV} to a writable folder)"
            )

    def _try(self, locks: list[Wanted]) -> tuple[Wanted, str] | None:
        """Take every lock, or none (then: the busy one, and who holds it)."""
        taken: list[tuple[int, Wanted]] = []
        try:
            for want in locks:
                while True:
                    fd = os.open(want.path, os.O_RDWR | os.O_CREAT, 0o666)
                    taken.append((fd, want))
                    with contextlib.suppress(OSError):
                        os.fchmod(fd, 0o666)  # other users' runs open it too (umask)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:  # busy: none is kept
                        who = _holder(fd)
                        _close(taken)
                        return want, who
                    if _same_file(fd, want.path):
                        break
                    os.close(taken.pop()[0])  # its holder removed it as it ended: again
        except OSError:
            _close(taken)
            raise
        self.held += taken
        self.folder = self.folder or any(not w.device for w in locks)
        self.write_info()
        return None

    def note_folder(self, out: Path) -> None:
        """Name the run folder in the lock files (a run waiting for them shows it), and lock
        it, if not yet (a new run's: a ``--resume`` of it is refused while it runs)."""
        self.info["out"] = os.path.abspath(out)
        if not self.folder:
            self.take([folder_lock(out)], 0.0)
        self.write_info()

    def write_info(self) -> None:
        data = json.dumps(self.info).encode()
        for fd, _ in self.held:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)

    def release(self) -> None:
        """Drop every lock: a run folder's lock file goes (one per run would pile up), a
        GPU's stays for the next run."""
        for fd, want in self.held:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                if not want.device:
                    os.unlink(want.path)  # whoever opened it before sees it gone (_same_file)
            os.close(fd)  # closing drops the flock
        self.held = []


def _close(taken: list[tuple[int, Wanted]]) -> None:
    for fd, _ in taken:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open on ``fd`` (not removed meanwhile)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except OSError:
        return False


def _lock_folder(folder: Path) -> None:
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            folder.chmod(0o1777)  # every user's runs make their lock files here


def _holder(fd: int) -> str:
    """Who holds the lock open on ``fd``, from what it wrote into the file."""
    for _ in range(5):  # it may have taken the lock and not yet written
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(os.pread(fd, 4096, 0) or b"null")
            if isinstance(info, dict) and info.get("pid"):
                out = info.get("out") or "(being made)"
                return (
                    f"pid {info['pid']} on {info.get('host')} since {info.get('since')}, "
                    f"run folder {out}"
                )
        time.sleep(0.05)
    return "a process that did not say which"


def _refusal(want: Wanted, who: str, waited: float) -> str:
    head = (
        f"{want.what} was still in use by another gpucheck run after {waited:g} s ({who})"
        if waited > 0
        else f"{want.what} is in use by another gpucheck run ({who})"
    )
    if not want.device:
        return f"{head}: it is still running; nothing was run (resume it once it has ended)"
    return (
        f"{head}; nothing was run: let it finish, pass --wait-for-devices SECONDS to queue "
        f"behind it, or choose other devices with --device"
    )


@contextlib.contextmanager
def held(
    targets: Sequence[tuple[str, Any, str | None, Any]],
    resume: Path | None,
    wait_s: float,
    notes: list[str],
) -> Iterator[Held]:
    """Hold the locks of a run on ``targets`` (and of the folder it resumes) while the body
    runs; raises :class:`DevicesBusy` (one line) when another run holds one, at once or after
    ``wait_s`` seconds. Where the lock folder cannot be used the run goes unlocked, with a
    note in ``notes``."""
    hold = Held(notes)
    try:
        hold.take(wanted(targets, resume), wait_s)
        yield hold
    finally:
        hold.release()
