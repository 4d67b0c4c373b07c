"""What a case may do to the worker process it runs in, and what the worker does about it.

* The controller's lifeline (:data:`~gpucheck.model.contract.LIFELINE_FD_ENV`): a worker whose
  ``gpucheck run`` died (SIGKILL, the OOM killer) stops at once with every process of its
  group, so nothing goes on writing records into a folder that ``--resume`` continues.
* A case that changed the process's working folder or the CUDA environment variables: the
  change is undone before the next case and becomes a warning (:func:`changed_state`).
* Processes a case started and left running (:func:`live_children`), in a session of their
  own too: the worker joins the cgroup the controller made for it, where one could be made
  (:func:`join_cgroup`), and adopts what its cases' children leave orphaned
  (:func:`adopt_orphans`), so that each is its child until the controller ends it.
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

from gpucheck import processes
from gpucheck.model.contract import CGROUP_ENV, LIFELINE_FD_ENV

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
    """The controller is gone: end what the cases left running (in sessions of their own
    too), then this worker's process group, this process with it."""
    found = [p for pid in processes.children(os.getpid()) if (p := processes.Proc.of(pid))]
    processes.end(found)
    with contextlib.suppress(OSError):
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)


def join_cgroup() -> bool:
    """Join the cgroup the controller made for this worker (:data:`CGROUP_ENV`), before any
    case starts a process: what the cases start is in it, and ends with it. False where there
    is none or it cannot be joined (the controller then ends what the worker recorded)."""
    path = os.environ.pop(CGROUP_ENV, None)  # not for the cases' own gpucheck runs
    return path is not None and processes.join(path)


def adopt_orphans() -> bool:
    """Make this worker the parent of whatever its cases' processes leave orphaned (a
    daemon's double fork): ``PR_SET_CHILD_SUBREAPER``, Linux only. Its children are what it
    records, and what the controller ends."""
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    return False


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
    (``/proc``); elsewhere empty. Read twice a case (:func:`gpucheck.processes.children`)."""
    return {pid: processes.cmdline(pid) for pid in processes.children(os.getpid())}


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
