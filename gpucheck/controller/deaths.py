"""What a worker's end means: how it ended, read once (:class:`WorkerEnd`, its
:data:`Ending`), the lines of its stderr that say why, the hint of a crash record (what a
crash of this kind usually means, and what to do next), the signal that killed it, the
evidence of a hang (its threads' stacks), and the one line of a run stopped because a worker
could not write its output."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpucheck.controller import stacks as dumps
from gpucheck.errors import CUDA_ERROR_MARKERS, sticky_cuda_error_line
from gpucheck.model import worker_state
from gpucheck.model.contract import (
    EXIT_CONTEXT_LOST,
    EXIT_OUTPUT_ERROR,
    EXIT_SANITIZER_LIMIT,
    NORMAL_EXITS,
)
from gpucheck.model.worker_state import WorkerState
from gpucheck.sanitizer import command as sanitizer_cmd

#: characters of a dead worker's stderr a record keeps
STDERR_TAIL = 4000
#: characters of a hung worker's stacks (Python, native) its record keeps
STACKS_CHARS = 8000


#: stderr lines that say why a process died; they go first in a crash record's evidence
CRASH_MARKERS = (
    "terminate called",
    "what():",
    "Fatal Python error",
    "Segmentation fault",
    "Aborted",
    "core dumped",
    "gpucheck:",
    *CUDA_ERROR_MARKERS,
)


#: what a worker's end means to the run, as the harness acts on it
Ending = Literal[
    "finished",  # it ran its cases to the end (each has its record)
    "output-error",  # it could not write a record: neither can the others, the run stops
    "hung",  # it was killed in a case that ran past the timeout
    "context-lost",  # its CUDA context was lost: its case's record says so, a fresh one goes on
    "sanitizer-limit",  # compute-sanitizer's print limit is near: a fresh one goes on
    "tool-crash",  # compute-sanitizer itself ended in a case: the case's outcome is unknown
    "crashed",  # it died in a case
    "worker-error",  # it died outside any case (collection, start-up)
]
#: endings that make a record of the case it was in
DEATHS: tuple[Ending, ...] = ("hung", "tool-crash", "crashed")


@dataclass(frozen=True)
class WorkerEnd:
    """How one worker process ended, as the harness sees it once what it left is killed.

    Attributes:
        rc: the worker's exit code; where compute-sanitizer's own (``ERROR_EXIT``) hides it,
            what the worker's state says it was.
        state: the worker's last state file.
        case: the case it was in (the one it hung in, else its state's), or None.
        hung: the harness killed it for running past the timeout.
        sanitizer: it ran under compute-sanitizer (the process watched is the tool).
        tool_crashed: compute-sanitizer ended while the worker under it still ran.
        tool_pid: the process the harness started (the worker, or compute-sanitizer).
        worker_pid: the Python worker's own pid (0: it never said).
        stderr: the tail of its stderr.
    """

    rc: int
    state: WorkerState
    case: str | None
    hung: bool
    sanitizer: bool
    tool_crashed: bool
    tool_pid: int
    worker_pid: int
    stderr: str

    @classmethod
    def of(
        cls,
        rc: int,
        state: WorkerState,
        hung_case: str | None,
        sanitizer: bool,
        tool_crashed: bool,
        tool_pid: int,
        stderr: str,
    ) -> WorkerEnd:
        case = hung_case or state.case
        if sanitizer and rc == sanitizer_cmd.ERROR_EXIT:  # the tool's exit code hides the worker's
            if state.exit_reason == worker_state.CONTEXT_LOST:
                rc = EXIT_CONTEXT_LOST
            elif state.exit_reason == worker_state.SANITIZER_LIMIT:
                rc = EXIT_SANITIZER_LIMIT
            elif not case:  # ended normally; its findings are in the case records
                rc = 1
        return cls(
            rc,
            state,
            case,
            hung_case is not None,
            sanitizer,
            tool_crashed,
            tool_pid,
            state.pid or 0,
            stderr,
        )

    @property
    def ending(self) -> Ending:
        """What the end means (the first that applies, in :data:`Ending`'s order)."""
        rc = self.rc
        if rc == EXIT_OUTPUT_ERROR:
            return "output-error"
        if self.hung:
            return "hung"
        if rc == EXIT_CONTEXT_LOST:
            return "context-lost"
        if rc == EXIT_SANITIZER_LIMIT and self.state.exit_reason == worker_state.SANITIZER_LIMIT:
            return "sanitizer-limit"
        if rc not in NORMAL_EXITS or self.case or self.tool_crashed:  # os._exit(0) in a case
            if self.case:
                return "tool-crash" if self.tool_crashed else "crashed"
            return "worker-error"
        return "finished"

    @property
    def in_case(self) -> bool:
        """It ended abnormally inside a case: what it left goes on that case's record."""
        return bool(self.case) and self.rc not in NORMAL_EXITS

    @property
    def how(self) -> str:
        """How it ended, for a record's message (``killed by SIGSEGV``)."""
        if self.rc == sanitizer_cmd.ERROR_EXIT and self.sanitizer and not self.tool_crashed:
            return "was ended by compute-sanitizer after a fatal error"
        sig = signal_name(self.rc)
        return f"killed by {sig}" if sig else f"exited with code {self.rc}"

    @property
    def who(self) -> str:
        """Which process ended, for a record's message."""
        if self.tool_crashed:
            return f"compute-sanitizer (pid {self.tool_pid})"
        if self.sanitizer and not self.worker_pid:
            return f"compute-sanitizer (pid {self.tool_pid}) or the worker under it"
        return "worker"


def crash_digest(stderr: str, limit: int = STDERR_TAIL) -> str:
    """The lines that explain a crash (wherever they are), then the tail of stderr."""
    key = [line for line in stderr.splitlines() if any(m in line for m in CRASH_MARKERS)]
    head = "\n".join(dict.fromkeys(key))[:1500]
    tail = stderr[-(limit - len(head)) :] if len(stderr) > limit - len(head) else stderr
    return f"{head}\n--- tail ---\n{tail}" if head else tail


def crash_hint(
    rc: int, stderr: str, under_sanitizer: bool = False, other_current: bool = True
) -> str:
    """What a crash of this kind means, and what to do next (``other_current``: another
    device than the case's was current, so a device guard may be missing)."""
    if under_sanitizer and rc == sanitizer_cmd.ERROR_EXIT:
        return (
            "compute-sanitizer stopped the process at a fatal access: its records on this "
            "case name the kernel and the access"
        )
    if "terminate called" in stderr or "what():" in stderr:
        return (
            "the process aborted because a C++ exception escaped the extension (e.g. "
            "thrust::system_error after a kernel faulted): "
            + (
                "with another device current, check the device guard of the op this case "
                "calls, then run it under --mode sanitizer:memcheck"
                if other_current
                else "its own device was current, so not a device guard: see the faulting "
                "kernel under --mode sanitizer:memcheck"
            )
        )
    if sticky_cuda_error_line(stderr) is not None:
        return (
            "the CUDA context was lost (a sticky error such as an illegal memory access) "
            "and the process died with it: run the case under --mode sanitizer:memcheck "
            "to see the faulting kernel and access"
        )
    if rc == -getattr(signal, "SIGSEGV", 11):
        return (
            "segmentation fault in native code (host side): an extension dereferenced a "
            "bad host pointer or a tensor's data on the wrong side; the Python frames in "
            "the stderr tail show the call"
        )
    if rc == -getattr(signal, "SIGABRT", 6):
        return (
            "the process aborted (abort(), a failed assert or a fatal library error); "
            "the stderr tail shows the last words"
        )
    if rc in NORMAL_EXITS:
        return (
            "the process exited in the middle of the case (os._exit(), or exit() called by a "
            "library): the case never finished, so it does not count as passed"
        )
    if rc == -getattr(signal, "SIGKILL", 9):
        return "killed with SIGKILL, often by the kernel's out-of-memory killer: check host memory"
    return "the process died inside the case; run it alone under compute-sanitizer"


def signal_name(returncode: int) -> str | None:
    """The signal that ended a process (its negative return code), or None."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def hang_evidence(stacks: str, native: str, digest: str) -> tuple[str, str]:
    """(evidence, stderr digest) of a hung case's record: its threads' Python stacks as the
    worker wrote them when asked (faulthandler: innermost frame first), the native frames
    under them (py-spy), then what its stderr says."""
    stacks = stacks.strip() or "(no stack dump: the worker did not answer SIGUSR1)"
    evidence = (
        f"--- Python stacks of every thread when stopped (innermost first, "
        f"down to pytest) ---\n{dumps.trim_threads(stacks)[:2500]}\n"
        f"--- native frames (py-spy dump --native) ---\n"
        f"{dumps.trim_threads(native)[:2500]}"
    ).strip()
    digest = (
        f"--- Python stacks of every thread when stopped ---\n"
        f"{stacks[:STACKS_CHARS]}\n--- py-spy dump --native ---\n"
        f"{native[:STACKS_CHARS]}\n{digest}"
    ).strip()
    return evidence, digest


def _why_unwritable(folder: Path) -> str:
    """Why a worker that could not even say so could not write into ``folder``."""
    try:
        fs = os.statvfs(folder)
    except OSError as err:
        return str(err.strerror or err)
    if fs.f_flag & os.ST_RDONLY:
        return "Read-only file system"
    if fs.f_bavail * fs.f_frsize < 1 << 20:
        return f"No space left on device ({fs.f_bavail * fs.f_frsize} bytes free)"
    return "the disk is full or the folder is not writable"


def output_fault(stderr: str, out_dir: Path, label: str) -> str:
    """The one line of a run stopped because a worker could not write into its folder: the
    worker's own ``gpucheck: cannot write ...`` line where its log holds one (the log may be
    on the full disk too), with what was kept and the ``--resume`` that finishes the run,
    whichever of the worker's files (its state, a record) failed first."""
    said = [
        line.removeprefix("gpucheck: ")
        for line in stderr.splitlines()
        if line.startswith("gpucheck: cannot write")
    ]
    what = (
        said[-1]
        if said
        else (
            f"cannot write to the run folder {out_dir} (worker {label}): {_why_unwritable(out_dir)}"
        )
    )
    if "--resume" in what:
        return what
    return (
        f"{what.rstrip('.; ')}; the run stopped here, every record written before is kept "
        f"(make room or make the folder writable, then `gpucheck run --resume {out_dir}`)"
    )
