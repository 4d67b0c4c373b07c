"""The launch trace's recorder from CUPTI's callback API (``launch_callbacks.cpp`` beside this
file): what :mod:`gpucheck.detectors.launch_trace` uses in place of kineto's profiler windows
when it can.

Why: a kineto window asks CUPTI for activity records, and once a process has had one, CUPTI
stays attached to it with its kernels instrumented: every later launch of the worker costs a
few microseconds more under ``CUDA_LAUNCH_BLOCKING`` and its GPU work ~1 % more, in every case
that follows (``benchmarks/cupti_window.py``). The callback API tells the same things at the
launch itself (the stream in the call's own arguments, the device of its context, the
kernel's name) with no record from the GPU and no kernel instrumented, and the recorder lets
CUPTI go when a window closes, so a test's own profiler can have it between windows.

What it costs inside a window, kept small and counted: a launch is recorded in C++ (its name
demangled once a process, into a table the records index); a thread's launches inside
gpucheck's own work around a call (:meth:`Recorder.aside`) are not recorded at all (the
judgement leaves them out anyway); the window is read back in one call (:meth:`Recorder.take`);
and the time the recorder took at the launches (:meth:`Recorder.spent`) goes into the
trace's ``cost_s`` (those launches are the case's own, where no listener's time is counted).

The library is built on first use (a C++ file and ``libcupti``, no Python or torch headers: a
second) into gpucheck's build cache, and loaded with ctypes. It is the trace's recorder by
default (proven on GPUs by ``tools/gpu launch-callbacks`` and the self-test);
``GPUCHECK_LAUNCH_TRACE=kineto`` asks for kineto's windows instead. With that, an unknown
value, or without a CUDA toolkit that has CUPTI's headers, or a compiler, :func:`recorder` is
None (:data:`why_not` says why) and the trace uses kineto.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

SOURCE = Path(__file__).with_name("launch_callbacks.cpp")
LIBRARY = "liblaunch_callbacks.so"
#: the trace's recorder: ``callbacks`` (the default: this one where it can be had, else kineto)
#: or ``kineto`` (kineto's profiler windows)
BACKEND_ENV = "GPUCHECK_LAUNCH_TRACE"
BACKENDS = ("callbacks", "kineto")
#: a record's kind (the library's enum) as the trace names GPU work
KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
#: why there is no recorder in this process ("" while there is one or none was asked for)
why_not = ""


class Launch(NamedTuple):
    """One launch, copy or memset made while the recorder was open."""

    seq: int  # its place in the sequence the markers share
    stream: int  # 0: legacy default stream; 2: per-thread default stream; else the handle
    device: int  # the device of the context it was made in (-1: unknown)
    kind: str  # one of KINDS
    name: str  # the kernel's demangled name; "Memcpy ..." / "Memset" for the others


class Recorder:
    """The loaded library (see the module text)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, i32 = ctypes.c_int64, ctypes.c_int32
        lib.gc_open.restype = ctypes.c_int
        lib.gc_close.restype = ctypes.c_int
        lib.gc_mark.restype = i64
        lib.gc_count.restype = i64
        lib.gc_read.restype = i64
        lib.gc_read.argtypes = [
            i64,
            ctypes.POINTER(i64),
            ctypes.POINTER(i64),
            ctypes.POINTER(i32),
            ctypes.POINTER(i32),
            ctypes.POINTER(i32),
        ]
        lib.gc_names.restype = i64
        lib.gc_name_length.restype = i64
        lib.gc_name_length.argtypes = [i64]
        lib.gc_name.restype = ctypes.c_int
        lib.gc_name.argtypes = [i64, ctypes.c_char_p, i64]
        lib.gc_spent_ns.restype = i64
        lib.gc_aside.restype = None
        lib.gc_aside.argtypes = [ctypes.c_int]
        lib.gc_inject.restype = ctypes.c_int
        lib.gc_inject.argtypes = [i32, i64, i32, ctypes.c_char_p]
        lib.gc_clear.restype = None
        self.lib = lib
        self.names: list[str] = []  # the library's name table, as read so far

    def open(self) -> int:
        """Start recording: 0, or CUPTI's error code (nothing held then)."""
        return int(self.lib.gc_open())

    def close(self) -> int:
        """Stop recording and let CUPTI go."""
        return int(self.lib.gc_close())

    def mark(self) -> int:
        """The next place in the sequence (a marker's)."""
        return int(self.lib.gc_mark())

    def aside(self, started: bool) -> None:
        """gpucheck's own work around a call starts or ends on this thread: its launches are
        not recorded meanwhile (the judgement leaves them out anyway; other threads' are)."""
        self.lib.gc_aside(1 if started else 0)

    def spent(self) -> float:
        """Seconds the recorder took at the launches it recorded since the last call."""
        return int(self.lib.gc_spent_ns()) / 1e9

    def take(self) -> list[Launch]:
        """The records so far, in the order they were made; the recorder forgets them."""
        lib = self.lib
        n = int(lib.gc_count())
        if n <= 0:
            lib.gc_clear()
            return []
        seq, stream = (ctypes.c_int64 * n)(), (ctypes.c_int64 * n)()
        device, kind, name = (ctypes.c_int32 * n)(), (ctypes.c_int32 * n)(), (ctypes.c_int32 * n)()
        got = int(lib.gc_read(n, seq, stream, device, kind, name))
        lib.gc_clear()
        names = self._names()
        rows = zip(seq[:got], stream[:got], device[:got], kind[:got], name[:got], strict=True)
        return [
            Launch(s, st, d, KINDS[k] if 0 <= k < len(KINDS) else "kernel", names[i])
            for s, st, d, k, i in rows
        ]

    def _names(self) -> list[str]:
        """The library's name table, the names it learnt since the last read added."""
        lib = self.lib
        for i in range(len(self.names), int(lib.gc_names())):
            size = int(lib.gc_name_length(i)) + 1
            buf = ctypes.create_string_buffer(size)
            lib.gc_name(i, buf, size)
            self.names.append(buf.value.decode("utf-8", "replace"))
        return self.names


def cupti_paths(home: Path | None, search: list[str] | None = None) -> tuple[Path, Path] | None:
    """(folder of ``cupti.h``, folder of ``libcupti.so``): the CUDA toolkit's (``include`` or
    ``extras/CUPTI/include``; ``lib64``, ``lib``, ``extras/CUPTI/lib64``), else a pip
    ``nvidia`` package's on ``search`` (sys.path); None without both."""
    roots: list[Path] = []
    if home is not None:
        roots += [home, home / "extras" / "CUPTI", *sorted(home.glob("targets/*"))]
    for entry in sys.path if search is None else search:
        base = Path(entry) / "nvidia"
        if base.is_dir():
            roots += sorted(p for p in base.iterdir() if p.is_dir())
    for root in roots:
        include = root / "include"
        if not (include / "cupti.h").is_file():
            continue
        for lib in (root / "lib64", root / "lib"):
            if any(lib.glob("libcupti.so*")):
                return include, lib
    return None


def build() -> Path:
    """The library, built into gpucheck's build cache unless it is there already (keyed by the
    source and the CUPTI it is built against). OSError / CalledProcessError when it cannot be."""
    # the build's toolchain and cache are the kernels' (a floor above the detectors)
    # lazy: needed once, when the first window opens
    from gpucheck._csrc import toolchain

    found = cupti_paths(toolchain.cuda_home())
    if found is None:
        raise FileNotFoundError("no CUDA toolkit with CUPTI's headers and libcupti found")
    include, libdir = found
    key = hashlib.sha256(SOURCE.read_bytes() + f"{include}|{libdir}".encode()).hexdigest()[:16]
    folder = toolchain.build_dir(f"launch_callbacks-{key}")
    target = folder / LIBRARY
    if target.is_file():
        return target
    env = {**os.environ, **toolchain.host_compiler_env()}
    part = folder / f"{LIBRARY}.{os.getpid()}.part"
    cmd = [
        env.get("CXX", "c++"),
        "-std=c++17",
        "-O2",
        "-shared",
        "-fPIC",
        f"-I{include}",
        str(SOURCE),
        f"-L{libdir}",
        "-lcupti",
        f"-Wl,-rpath,{libdir}",
        "-o",
        str(part),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, timeout=300)
    os.replace(part, target)  # another worker building at once: either file is whole
    return target


def asked() -> str:
    """The recorder ``GPUCHECK_LAUNCH_TRACE`` asks for (lower case; unset: the default)."""
    return os.environ.get(BACKEND_ENV, "").strip().lower() or BACKENDS[0]


@functools.cache
def recorder() -> Recorder | None:
    """This process's recorder, built and loaded once; None (:data:`why_not` says why) when
    ``GPUCHECK_LAUNCH_TRACE`` asks for kineto (or names no recorder) or it cannot be had."""
    global why_not
    asked_for = asked()
    if asked_for != "callbacks":
        why_not = f"{BACKEND_ENV}={asked_for}" + (
            "" if asked_for in BACKENDS else f" is not one of {', '.join(BACKENDS)}: kineto"
        )
        return None
    try:
        return Recorder(ctypes.CDLL(str(build())))
    except subprocess.CalledProcessError as err:
        last = (err.stderr or "").strip().splitlines()[-1:] or [f"exit status {err.returncode}"]
        why_not = f"its build failed: {last[0]}"
    except (OSError, subprocess.SubprocessError) as err:
        why_not = f"{type(err).__name__}: {err}"
    return None
