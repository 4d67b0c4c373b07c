"""The first worker's interpreter, started before its command is known.

A worker is a Python that imports pytest (~0.12 s) and then runs the suites; the controller
needs ~0.05 s of its own (click, its settings, the suites, the run folder) before it knows
that worker's command. ``gpucheck run`` therefore starts one interpreter first thing
(:func:`start`, called by the ``gpucheck`` command before anything else is imported), which
imports pytest meanwhile and then waits for its job: one line of JSON on its stdin (its
arguments, its environment, its two log files). :func:`take` gives it the first worker
command that it can run exactly as a freshly started one would; any other command (a
different Python, a tool in front, a variable that Python or the dynamic linker read at
start-up, such as ``PYTHONPATH`` or ``LD_PRELOAD``) is started afresh, and an interpreter
nobody took ends when its stdin closes (this process's end, whatever the reason).

What a worker's process is, in both cases, is written once: :data:`QUICK_EXIT`. Only the
standard library is imported here (this module runs before the command line is parsed).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys

#: a worker's process where nothing needs the interpreter's teardown: pytest, then
#: gpucheck.worker.quick_exit (gpucheck is imported only after pytest: run as ``python -m`` of
#: a gpucheck module, every worker's output carried pytest's "Module already imported so
#: cannot be rewritten; gpucheck" warning). The current folder goes first on sys.path by its
#: absolute path, as ``python -m pytest`` puts it (``-c`` puts "", which follows a chdir).
_PATH = (
    "import os, sys; sys.path[0] = os.getcwd(); "
    "sys.path[:0] = [p for p in [os.environ.get('GPUCHECK_PACKAGE_PATH')] if p]; "
)
QUICK_EXIT = (
    _PATH + "import pytest; code = pytest.main(); "
    "from gpucheck.worker.quick_exit import end; end(code)"
)
#: a worker that ends the usual way (under compute-sanitizer; a rank), where the current
#: folder holds another gpucheck (:data:`PACKAGE_PATH_ENV`): ``python -m pytest`` as
#: :data:`QUICK_EXIT` puts sys.path (elsewhere it is ``python -m pytest`` itself)
PLAIN = _PATH + "import pytest; sys.exit(pytest.main())"
#: the folder that holds the gpucheck package the controller runs, given to its workers
#: where the current folder holds another one (a checkout of gpucheck, with a wheel built
#: from it installed): :data:`QUICK_EXIT` and :data:`PLAIN` put it first on sys.path, so
#: that the worker runs the same gpucheck as the controller, not the checkout's (which lacks
#: what only an install maps into the package: its suites, its CUDA sources)
PACKAGE_PATH_ENV = "GPUCHECK_PACKAGE_PATH"
#: what the waiting interpreter does once pytest is imported: read its job, or end when
#: nobody sends one; then its logs on descriptors 1 and 2 (the controller opened them
#: already: a folder it cannot write is its error, as for a fresh worker), nothing on 0, the
#: job's environment in place of its own, the job's arguments; then :data:`QUICK_EXIT`
JOB = """
import json, os, sys
job = sys.stdin.readline()
if not job:
    os._exit(0)
job = json.loads(job)
for fd, name in ((1, "stdout"), (2, "stderr")):
    f = os.open(job[name], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    os.dup2(f, fd)
    os.close(f)
f = os.open(os.devnull, os.O_RDONLY)
os.dup2(f, 0)
os.close(f)
os.environ.clear()
os.environ.update(job["env"])
sys.argv[1:] = job["argv"]
"""
WAITING = "import pytest\n" + JOB + QUICK_EXIT
#: what every worker's interpreter gets at its start (read by Python as it starts)
STARTUP_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
#: the variables a job may set or change over the waiting interpreter's: read only once the
#: job runs (CUDA, torch, OpenMP, gpucheck's own). Any other difference (PYTHONPATH,
#: LD_PRELOAD, HOME, ...) may have mattered at its start: that command starts afresh.
LATE_PREFIXES = ("GPUCHECK_", "CUDA_", "OMP_", "NCCL_", "TORCH_", "PYTORCH_")
#: the ``run`` options under which no worker of this kind is started (ranks of one process
#: group, Ray's nodes); ``--help`` starts nothing at all
NO_WORKER = ("--distributed", "--ray", "--help", "-h")

_LIFELINE: list[int] = []  # this process's pipe (read end, write end), made once
_WAITING: list[tuple[subprocess.Popen[bytes], dict[str, str]]] = []  # (process, its env)


def package_env() -> dict[str, str]:
    """``{PACKAGE_PATH_ENV: folder}`` where the current folder holds a gpucheck package other
    than this one (see :data:`PACKAGE_PATH_ENV`); else nothing."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    here = os.path.join(os.getcwd(), "gpucheck")
    if os.path.isfile(os.path.join(here, "__init__.py")) and os.path.realpath(here) != package:
        return {PACKAGE_PATH_ENV: os.path.dirname(package)}
    return {}


def lifeline() -> int:
    """The read end of the pipe whose write end only this process holds: a worker given it
    sees end-of-file when this process is gone, however it died (gpucheck.worker.guard)."""
    if not _LIFELINE:
        _LIFELINE.extend(os.pipe())  # not inherited, but by the workers it is passed to
    return _LIFELINE[0]


def wanted(argv: list[str]) -> bool:
    """Whether the command line ``argv`` (without the program) is a ``gpucheck run`` that
    starts harness workers."""
    if not argv or argv[0] != "run":
        return False
    own = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
    return not any(a in NO_WORKER or a.startswith("--ray=") for a in own)


def start(argv: list[str]) -> None:
    """Start the waiting interpreter when ``argv`` is a run that will want one; a system that
    cannot start it costs nothing but the wait (the worker starts afresh)."""
    if _WAITING or not wanted(argv) or not sys.executable:  # "": an embedding interpreter
        return
    env = {**os.environ, **STARTUP_ENV}
    fd = lifeline()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", WAITING],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            pass_fds=(fd,),
            start_new_session=True,
        )
    except OSError:
        return
    _WAITING.append((proc, env))
    atexit.register(release)


def take(
    cmd: list[str], env: dict[str, str], stdout: str, stderr: str
) -> subprocess.Popen[bytes] | None:
    """The waiting interpreter, given the worker command ``cmd`` with environment ``env`` and
    its logs, if it can run it as a fresh process would; else None (and it is let go)."""
    if not _WAITING:
        return None
    proc, started = _WAITING.pop()
    changed = {k for k in {*env, *started} if env.get(k) != started.get(k)}
    same = (
        cmd[:3] == [sys.executable, "-c", QUICK_EXIT]
        and all(k.startswith(LATE_PREFIXES) for k in changed)
        and proc.poll() is None
    )
    pipe = proc.stdin
    try:
        if same and pipe is not None:
            job = {"argv": cmd[3:], "env": env, "stdout": stdout, "stderr": stderr}
            pipe.write(json.dumps(job).encode() + b"\n")
        if pipe is not None:
            pipe.close()
    except OSError:  # it died on the way (a broken pytest): the worker starts afresh
        return None
    return proc if same else None


def release() -> None:
    """Let an interpreter that nobody took end (its stdin closes)."""
    while _WAITING:
        proc, _ = _WAITING.pop()
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
