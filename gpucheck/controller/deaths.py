"""What a worker's death means: the lines of its stderr that say why, the hint of a crash
record (what a crash of this kind usually means, and what to do next), the signal that
killed it, the evidence of a hang (its threads' stacks), and the one line of a run stopped
because a worker could not write its output."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from gpucheck.controller import stacks as dumps
from gpucheck.errors import CUDA_ERROR_MARKERS, sticky_cuda_error_line
from gpucheck.model.contract import NORMAL_EXITS
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
