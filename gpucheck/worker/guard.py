"""What a case may do to the worker process it runs in, and what the worker does about it.

* The controller's lifeline (:data:`~gpucheck.model.contract.LIFELINE_FD_ENV`): a worker whose
  ``gpucheck run`` died (SIGKILL, the OOM killer) stops at once with every process of its
  group, so nothing goes on writing records into a folder that ``--resume`` continues.
* A case that changed the process's working folder or the CUDA environment variables: the
  change is undone before the next case and becomes a warning (:func:`changed_state`).
* Processes a case started and left running (:func:`live_children`).
* A process forked by a case that returned into pytest (``os.fork()`` without exec): it must
  not run the later cases again nor write their records (:func:`is_fork_of`).
* Bytes that are not UTF-8 written to ``sys.stdout.buffer``: pytest's capture of the workers
  (``--capture=sys``) must still read them (:func:`tolerate_undecodable_output`).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import signal
import stat
import sys
import threading
from dataclasses import dataclass

from gpucheck.model.contract import LIFELINE_FD_ENV

#: environment variables a case must leave as it found them
WATCHED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_CUDA_ALLOC_CONF",
)


def watch_controller() -> bool:
    """Start the thread that ends this worker when the controller is gone; False when this
    process has no lifeline (plain pytest, or a descriptor that is not ours)."""
    value = os.environ.pop(LIFELINE_FD_ENV, None)  # not for the case's own subprocesses
    fd_text, inode, controller = [*(value or "").split(":"), "", ""][:3]
    if not fd_text.isdigit() or not inode.isdigit():
        return False
    fd = int(fd_text)
    try:
        st = os.fstat(fd)
    except OSError:  # closed on the way (a tool between the controller and us)
        return False
    if not stat.S_ISFIFO(st.st_mode) or st.st_ino != int(inode):
        return False  # the number names another file now: not our lifeline
    if controller.isdigit():
        _die_with_parent(int(controller))

    def wait() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:  # not a descriptor we were given: no lifeline, never stop for it
            return
        # end of file: the controller's end closed, it died; its folder may be resumed
        _stop()

    threading.Thread(target=wait, name="gpucheck-lifeline", daemon=True).start()
    return True


def _stop() -> None:
    with contextlib.suppress(OSError):
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)


def _die_with_parent(controller: int) -> None:
    """SIGKILL from the kernel when the controller, our parent, dies: the lifeline's thread
    needs the GIL to act, and a case hung in C code may hold it for ever. Not under a tool
    between us (compute-sanitizer: our parent is the tool, whose crash is the controller's to
    report)."""
    if not sys.platform.startswith("linux") or os.getppid() != controller:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PDEATHSIG
    if os.getppid() != controller:  # it died before the request took hold
        _stop()


@dataclass(frozen=True)
class ProcessState:
    cwd: str
    env: tuple[tuple[str, str | None], ...]

    @classmethod
    def now(cls) -> ProcessState:
        try:
            cwd = os.getcwd()
        except OSError:  # the folder was removed under us
            cwd = ""
        return cls(cwd, tuple((k, os.environ.get(k)) for k in WATCHED_ENV))


def changed_state(before: ProcessState) -> list[str]:
    """What differs from ``before`` (one phrase each), put back as it was."""
    after = ProcessState.now()
    changes = []
    if after.cwd != before.cwd and before.cwd:
        changes.append(f"the working folder from {before.cwd} to {after.cwd or '(removed)'}")
        with contextlib.suppress(OSError):
            os.chdir(before.cwd)
    for (name, old), (_, new) in zip(before.env, after.env, strict=True):
        if old != new:
            changes.append(f"{name} from {old!r} to {new!r}")
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
    return changes


def live_children() -> dict[int, str]:
    """This process's running (not zombie) child processes: pid -> command line. Linux only
    (``/proc``); elsewhere empty. Read twice a case: from each thread's ``children`` list
    where the kernel keeps one (a few small reads), else by scanning every process of
    ``/proc`` for ours (plain reads, no pathlib)."""
    me = os.getpid()
    pids = _listed_children(me)
    if pids is None:
        try:
            pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        except OSError:
            return {}
    found: dict[int, str] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            # pid (comm) state ppid ...: comm may hold spaces and parentheses
            state, ppid = stat[stat.rindex(b")") + 2 :].split(None, 2)[:2]
            if int(ppid) != me or state in (b"Z", b"X"):
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        found[pid] = cmd.strip()[:200]
    return found


def _listed_children(me: int) -> list[int] | None:
    """The pids in ``/proc/ME/task/TID/children`` of every thread of this process (a child
    is listed under the thread that started it), or None where the kernel keeps no such
    list (built without ``CONFIG_PROC_CHILDREN``, or no ``/proc``)."""
    try:
        threads = os.listdir(f"/proc/{me}/task")
    except OSError:
        return None
    pids: list[int] = []
    for tid in threads:
        try:
            with open(f"/proc/{me}/task/{tid}/children", "rb") as f:
                pids += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            if os.path.isdir(f"/proc/{me}/task/{tid}"):
                return None  # the thread is there and its list is not: no lists here
        except (OSError, ValueError):
            continue  # the thread ended while we read
    return pids


def is_fork_of(pid: int) -> bool:
    """True in a process forked from the worker ``pid`` (a case's ``os.fork()``)."""
    return os.getpid() != pid


def tolerate_undecodable_output() -> None:
    """Read what a case wrote to the captured ``sys.stdout``/``sys.stderr`` with replacement
    characters where it is not UTF-8.

    A worker captures Python's streams only (``--capture=sys``: what native code writes to
    the fds must reach the worker's log), and pytest decodes that capture strictly: a case that
    writes bytes that are not UTF-8 to ``sys.stdout.buffer`` fails in its teardown, and so
    does the setup of every later case of the worker (the undecodable bytes stay in the
    buffer), none of which ran. Patched in gpucheck's workers only; a pytest without
    ``CaptureIO`` is left as it is.
    """
    from _pytest import capture  # pytest's own module: the class its sys capture writes to

    cls = getattr(capture, "CaptureIO", None)
    if cls is None or getattr(cls, "gpucheck_tolerant", False):
        return

    def getvalue(self: io.TextIOWrapper) -> str:
        assert isinstance(self.buffer, io.BytesIO)
        return self.buffer.getvalue().decode("UTF-8", errors="replace")

    cls.getvalue = getvalue
    cls.gpucheck_tolerant = True
