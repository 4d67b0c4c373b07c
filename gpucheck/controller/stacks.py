"""Where a stuck process is: what the controller adds to the Python stacks a worker's
faulthandler writes on SIGUSR1 (:mod:`gpucheck.worker.recorder`).

faulthandler's handler is C code that runs in the signal handler: it writes every thread's
Python stack even while a C function holds the GIL, so the Python frame that called into C is
always known. ``py-spy dump --native`` (when installed, and allowed to ptrace the process) adds
the native frames below it: which C/C++/CUDA call never returned. Without py-spy, or where the
kernel refuses it (ptrace permission, a process made non-dumpable), one line says why and the
Python stacks stand alone.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Hashable, Mapping
from typing import TypeVar

#: seconds one ``py-spy dump`` may take
PY_SPY_TIMEOUT_S = 20.0
#: the line a hang's evidence carries where py-spy is not installed
PY_SPY_MISSING = (
    "note: py-spy is not installed (not on PATH): no native frames (pip install "
    "py-spy to see where a process is stuck inside C++/CUDA)"
)
#: what a refused attach means, added to py-spy's own reason
PY_SPY_REFUSED_HINT = (
    "py-spy needs the right to ptrace the process: the same user and "
    "kernel.yama.ptrace_scope 0 or 1 (1: only from an ancestor), or "
    "CAP_SYS_PTRACE; a process made non-dumpable refuses it to all but "
    "CAP_SYS_PTRACE"
)
#: frames from here down are the test runner's own, not the case's
RUNNER_FRAMES = ("_pytest/", "pluggy/")

K = TypeVar("K", bound=Hashable)


def py_spy_installed() -> bool:
    return shutil.which("py-spy") is not None


def py_spy_dump(pid: int, timeout: float = PY_SPY_TIMEOUT_S) -> str:
    """``py-spy dump --native`` of ``pid``: its threads' frames without py-spy's header, or
    one line saying why there are none (py-spy missing, refused, failed, too slow)."""
    exe = shutil.which("py-spy")
    if exe is None:
        return PY_SPY_MISSING
    try:
        run = subprocess.run(
            [exe, "dump", "--native", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return f"py-spy dump failed: no answer within {timeout:g} s"
    except OSError as err:
        return f"py-spy dump failed: {err}"
    lines = run.stdout.splitlines()  # the frames, without the header (pid, command line)
    first = next((i for i, line in enumerate(lines) if line.startswith("Thread ")), 0)
    text = "\n".join(lines[first:]).rstrip()
    if run.returncode != 0:  # the reason is on stderr, before py-spy's own backtrace
        why = " ".join(run.stderr.split("Stack backtrace:")[0].split())
        refused = any(w in why for w in ("ermission denied", "not permitted", "ptrace"))
        text = (
            f"{text}\npy-spy dump failed (exit {run.returncode}): {why}"
            + (f" ({PY_SPY_REFUSED_HINT})" if refused else "")
        ).strip()
    return text


def py_spy_dumps(pids: Mapping[K, int]) -> dict[K, str]:
    """:func:`py_spy_dump` of several processes at once (empty when py-spy is missing)."""
    if not py_spy_installed():
        return {}
    out: dict[K, str] = {}

    def one(key: K, pid: int) -> None:
        out[key] = py_spy_dump(pid)

    threads = [threading.Thread(target=one, args=item) for item in pids.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PY_SPY_TIMEOUT_S + 5)
    return out


def trim(stack: str) -> str:
    """A stack (faulthandler's or py-spy's, innermost frame first) without the frames from
    where the test runner's own begin (pytest, pluggy); lines that are not frames (not
    indented: a thread's header, py-spy's reason for failing) stay."""
    keep = []
    runner = False
    for line in stack.splitlines():
        frame = line[:1].isspace()
        runner = runner or (frame and any(f in line for f in RUNNER_FRAMES))
        if not (frame and runner):
            keep.append(line)
    return "\n".join(keep)


def trim_threads(stacks: str) -> str:
    """Every thread's block of a faulthandler dump or a py-spy dump, each :func:`trim`-med."""
    blocks: list[list[str]] = []
    for line in stacks.strip().splitlines():
        if not line.strip():
            continue
        if line.startswith(("Thread ", "Current thread ")) or not blocks:
            blocks.append([])
        blocks[-1].append(line)
    # the thread that was running first (faulthandler's "Current thread", py-spy's main one)
    blocks.sort(key=lambda b: not b[0].startswith("Current thread") and '"MainThread"' not in b[0])
    return "\n".join(trim("\n".join(b)) for b in blocks)


def main_thread(stacks: str) -> str:
    """The faulthandler block of the main thread ('Current thread' first), else all."""
    blocks = stacks.strip().split("\n\n")
    main = [
        b
        for b in blocks
        if b.startswith(("Current thread", "Thread")) and "(most recent call first)" in b
    ]
    return (main[-1] if main else stacks).strip()
