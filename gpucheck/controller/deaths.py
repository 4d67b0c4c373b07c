"""What a worker's death means: the lines of its stderr that say why, and the hint of a
crash record (what a crash of this kind usually means, and what to do next)."""

from __future__ import annotations

import signal

from gpucheck.errors import CUDA_ERROR_MARKERS, sticky_cuda_error_line
from gpucheck.model.contract import NORMAL_EXITS
from gpucheck.sanitizer import command as sanitizer_cmd

#: characters of a dead worker's stderr a record keeps
STDERR_TAIL = 4000


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
