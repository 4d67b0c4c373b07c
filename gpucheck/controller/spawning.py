"""Starting a worker process (or a rank): its pytest command line, the files it gets (skip
list, logs, command), its environment and the controller's lifeline; and what keeps its
logs bounded while it runs. The harnesses (:mod:`.harness`, :mod:`.dist_harness`) decide
when; this module knows how."""

from __future__ import annotations

import errno
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpucheck import _distribution
from gpucheck.controller import prestart
from gpucheck.controller.deaths import STDERR_TAIL
from gpucheck.errors import OutputProblem
from gpucheck.model.contract import CGROUP_ENV, LIFELINE_FD_ENV
from gpucheck.model.layout import WorkerFiles
from gpucheck.model.worker_state import WorkerState
from gpucheck.processes import Cgroup, Proc
from gpucheck.processes import end as end_procs
from gpucheck.sanitizer import command as sanitizer_cmd

#: a worker's stdout or stderr log longer than this is cut (a case printing gigabytes): its
#: first and last LOG_KEEP bytes are kept, with a line saying how much was cut between them
LOG_CAP = 16 << 20
LOG_KEEP = 2 << 20


@dataclass
class WorkerSpec:
    label: str  # "cuda:0" or "cpu"
    device_index: int | None
    uuid: str | None
    suites: dict[str, Path]
    mode: str
    env: dict[str, str] = field(default_factory=dict)
    pytest_args: list[str] = field(default_factory=list)
    nvml_interval: float = 0.0  # seconds; 0 = no per-case NVML peaks
    sanitizer_tool: str | None = None  # run the worker under compute-sanitizer with this tool
    sanitizer: Path | None = None  # the compute-sanitizer executable


#: gpucheck's pytest plugin: its module, and the name of its ``pytest11`` entry point
#: (pyproject.toml). A worker blocks the entry point and loads the module by name, so the
#: plugin is there once whether or not the entry point is installed (no look-up of the
#: installed packages' entry points on the way to the first worker)
PLUGIN_MODULE = "gpucheck.pytest_plugin"
PLUGIN_ENTRY_POINT = _distribution.NAME
#: how many threads torch's CPU operators (OpenMP) use in a process
THREADS_ENV = "OMP_NUM_THREADS"


def thread_share(workers: int) -> dict[str, str]:
    """The environment that gives each of ``workers`` processes running at once on this
    machine (one per GPU, or per rank) its share of the CPUs this process may use.

    Left alone, torch's CPU operators start one OpenMP thread per CPU in every process, and
    N such pools on one machine spin against each other: a suite whose reference runs on
    the CPU then slows down with every GPU added (torchrun gives each of its ranks one thread
    for the same reason). Nothing when one process runs, or when ``OMP_NUM_THREADS`` is set:
    the user's choice is passed on as it is."""
    if workers < 2 or THREADS_ENV in os.environ:
        return {}
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return {THREADS_ENV: str(max(1, cpus // workers))}


def worker_command(
    spec: WorkerSpec,
    results_path: Path,
    state_path: Path,
    run_id: str,
    skip_path: Path | None = None,
    sanitizer_log: Path | None = None,
    wait_header: bool = False,
    quick_exit: bool = False,
    again: Path | None = None,
) -> list[str]:
    """The worker's command line. ``skip_path``: the cases it does not run (recorded);
    ``again``: those it runs without recording them (a distributed rank that recorded what
    its peers have not). ``wait_header``: the controller writes the run's header
    after starting it, and the worker appends no record before the header is there.
    ``quick_exit``: the process ends without the interpreter's teardown once pytest is done
    (:data:`.prestart.QUICK_EXIT`; never under compute-sanitizer, whose leak report comes from that
    teardown)."""
    cmd: list[str] = []
    if spec.sanitizer_tool and sanitizer_log is not None:
        cmd += sanitizer_cmd.prefix(spec.sanitizer_tool, sanitizer_log, spec.sanitizer)
        quick_exit = False
    plain = ["-c", prestart.PLAIN] if prestart.package_env() else ["-m", "pytest"]
    entry = ["-c", prestart.QUICK_EXIT] if quick_exit else plain
    cmd += [sys.executable, *entry, "-q", "-p", "no:cacheprovider"]
    if not any(a == "-s" or a.startswith("--capture") for a in spec.pytest_args):
        # Capture only Python's sys.stdout/err: what native code writes to the fd (libstdc++'s
        # "terminate called after throwing ...", CUDA messages) must reach the worker's
        # stderr file, or it is lost with a process that dies inside a case.
        cmd += ["--capture=sys"]
    # a file that cannot be collected (a syntax or import error) is a finding of its own
    # (the recorder's); the other files and suites still run
    cmd += ["--continue-on-collection-errors"]
    cmd += ["-p", f"no:{PLUGIN_ENTRY_POINT}", "-p", PLUGIN_MODULE]
    cmd += [
        "--gpucheck-results",
        str(results_path),
        "--gpucheck-state",
        str(state_path),
        "--gpucheck-run-id",
        run_id,
        "--gpucheck-mode",
        spec.mode,
    ]
    if wait_header:
        cmd += ["--gpucheck-wait-header"]
    if spec.device_index is not None:
        cmd += ["--gpucheck-device", str(spec.device_index)]
    if spec.uuid:
        cmd += ["--gpucheck-device-uuid", spec.uuid]
    if skip_path is not None:
        cmd += ["--gpucheck-skip", str(skip_path)]
    if again is not None:
        cmd += ["--gpucheck-again", str(again)]
    if spec.nvml_interval > 0:
        cmd += ["--gpucheck-nvml-interval", str(spec.nvml_interval)]
    if spec.sanitizer_tool and sanitizer_log is not None:
        cmd += [
            "--gpucheck-sanitizer-log",
            str(sanitizer_log),
            "--gpucheck-sanitizer-tool",
            spec.sanitizer_tool,
        ]
        if "-m" not in spec.pytest_args:
            cmd += ["-m", "sanitizer"]  # only the cases small enough for the sanitizer
    for name, path in spec.suites.items():
        cmd += ["--gpucheck-suite", f"{name}={path}"]
    cmd += spec.pytest_args
    cmd += [str(p) for p in spec.suites.values()]
    return cmd


def write_skip(files: WorkerFiles, skip: list[str] | None, path: Path | None = None) -> Path | None:
    """The file of case ids a fresh worker deselects (already recorded), or None; ``path``:
    another list of case ids of the worker's (:attr:`WorkerFiles.again`)."""
    path = path or files.skip
    if not skip:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # a resumed folder may lack it
        path.write_text("\n".join(skip) + "\n")
    except OSError as err:
        raise cannot_write(path, err) from err
    return path


def cannot_write(path: Path, err: OSError) -> OutputProblem:
    run = path.parent.parent
    fix = {
        errno.ENOSPC: "make room",
        errno.EDQUOT: "make room",
        errno.EFBIG: "make room",
        errno.EACCES: "make the folder writable",
        errno.EPERM: "make the folder writable",
        errno.EROFS: "make the folder writable",
    }.get(err.errno or 0, "make room or make the folder writable")
    return OutputProblem(
        f"cannot write {path}: {err.strerror or err}; the run stopped here, "
        f"every record written before is kept ({fix}, then "
        f"`gpucheck run --resume {run}`)"
    )


def spawn(
    cmd: list[str],
    env: dict[str, str],
    files: WorkerFiles,
    drop: tuple[str, ...] = (),
    cgroup: Cgroup | None = None,
) -> subprocess.Popen[bytes]:
    """Start one worker process (or rank), or hand its command to the interpreter
    :mod:`.prestart` started where that one can run it: its own session (so a hang can be
    signalled as a group), stdout/stderr into its files (appended: :func:`bound_log` cuts
    them), its command line beside them, the controller's lifeline, the ``cgroup`` made for
    it (it joins it: :func:`end_left` ends what its cases leave in it); ``env`` over this
    process's environment, less the variables in ``drop``."""
    try:
        files.folder.mkdir(parents=True, exist_ok=True)
        files.cmd.write_text(shlex.join(cmd) + "\n")  # to paste into a shell
    except OSError as problem:
        raise cannot_write(files.cmd, problem) from problem
    fd = prestart.lifeline()
    # the descriptor and the pipe's inode: a tool between us and the worker (compute-sanitizer)
    # may close it, and the number may then name another file in the worker
    full = {
        **os.environ,
        **prestart.STARTUP_ENV,
        **prestart.package_env(),
        **env,
        LIFELINE_FD_ENV: f"{fd}:{os.fstat(fd).st_ino}:{os.getpid()}",
        **({CGROUP_ENV: str(cgroup.path)} if cgroup is not None else {}),
    }
    for name in drop:
        full.pop(name, None)
    with open(files.stdout, "ab") as out, open(files.stderr, "ab") as err:
        waiting = prestart.take(
            cmd, full, str(files.stdout.absolute()), str(files.stderr.absolute())
        )
        if waiting is not None:  # the interpreter started first thing, pytest imported
            return waiting
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=err,
            env=full,
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def end_left(cgroup: Cgroup | None, state: WorkerState, seen: Iterable[Proc] = ()) -> list[Proc]:
    """End what a worker (or rank) that ended left running, in a session of its own too:
    every process of its ``cgroup``; the processes its state file last listed (the cases'
    children, as it saw them at the end of each case and of its session) and ``seen`` (its
    descendants as the controller saw them before it killed the worker), each only while it
    is still that process. The processes ended, for the run's notes."""
    ended = cgroup.kill() if cgroup is not None else []
    recorded = [Proc(pid, start, "") for pid, start in state.children]
    ended += end_procs([*recorded, *seen])
    return list({p.pid: p for p in ended}.values())


def left_note(who: str, ended: list[Proc]) -> str:
    """The run's note on what a worker left running and gpucheck ended."""
    return (
        f"{who}: ended {len(ended)} process(es) its cases left running: "
        + "; ".join(str(p) for p in ended[:5])
        + (f" and {len(ended) - 5} more" if len(ended) > 5 else "")
    )


#: the line a cut leaves (its count, read back when the log is cut again)
_CUT = re.compile(rb"\n\[gpucheck: (\d+) bytes of output cut here;")


def bound_log(path: Path, cap: int = LOG_CAP, keep: int = LOG_KEEP) -> None:
    """Cut a log past ``cap`` bytes to its first and last ``keep`` bytes (the worker appends,
    so it goes on writing at the new end; what it writes while this cuts may be lost). The
    cut line says how many bytes were cut in all: a log cut again (a case that goes on
    printing) adds to the count its earlier cut's line held."""
    try:
        size = path.stat().st_size
        if size <= cap:
            return
        with open(path, "r+b") as f:
            f.seek(keep)  # an earlier cut's line, cut again with what follows it: its count
            earlier = _CUT.match(f.read(200))
            cut = size - 2 * keep + (int(earlier.group(1)) if earlier else 0)
            f.seek(size - keep)
            last = f.read(keep)
            f.seek(keep)
            f.write(
                f"\n[gpucheck: {cut} bytes of output cut here; a log is kept "
                f"to its first and last {keep} bytes]\n".encode()
                + last
            )
            # what the worker appended meanwhile (its last words, often) moves down too: the
            # cut keeps no window but the one between the last size read and the truncate
            done, end = size, f.tell()
            while (grown := os.fstat(f.fileno()).st_size) > done:
                f.seek(done)
                extra = f.read(grown - done)
                done = grown
                f.seek(end)
                f.write(extra)
                end = f.tell()
            f.truncate(end)
    except OSError:
        return


def tail(path: Path, n: int = STDERR_TAIL) -> str:
    """The last ``n`` bytes of a file, decoded ("" if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc here, or no such process
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return stat[stat.rindex(")") + 2] not in "ZX"


def gpu_orphans(pids: list[int], wait_s: float = 10.0) -> str:
    """Whether NVML still lists any of ``pids`` with a context on a GPU after the kill."""
    from gpucheck import nvml

    if not nvml.status().ok:
        return "NVML orphan check: NVML not available"
    deadline = time.monotonic() + wait_s
    while True:
        held = {}
        for i in range(nvml.device_count()):
            procs, failed = nvml.list_processes(nvml.handle(i))
            if failed:
                return (
                    f"NVML orphan check: NVML failed on device {i} ({failed}): whether a "
                    "rank still holds a GPU context is not known"
                )
            for proc in procs:
                if proc.pid in pids:
                    held[proc.pid] = i
        if not held or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    if held:
        return (
            "NVML orphan check: FAILED, still holding a GPU context after the kill: "
            + ", ".join(f"pid {p} on NVML device {i}" for p, i in held.items())
        )
    return f"NVML orphan check: none of the {len(pids)} rank pids holds a GPU context"
