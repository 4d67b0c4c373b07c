"""Parent side: one pytest worker process per target device, all running at once.

Each worker appends its own case records to results.jsonl. The parent watches every worker's
state file: a case that runs past the timeout gets every thread's Python stack dumped
(SIGUSR1 -> faulthandler) and the worker killed, and becomes a ``hung`` record; a worker that
dies (signal, abort) becomes a ``crashed`` record for the case it was in, with the exit code or
signal and the tail of its stderr. Either way a fresh worker is started for that device and
continues with the cases not yet recorded. A worker whose CUDA context is lost (a sticky
error such as an illegal address) records that case as failed and exits with
EXIT_CONTEXT_LOST so that it, too, is replaced. Other devices' workers are not affected.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.metadata
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucheck.controller import stacks as dumps
from gpucheck.controller.deaths import STDERR_TAIL, crash_digest, crash_hint
from gpucheck.detectors.mixed_devices import cuda_error_hint
from gpucheck.errors import OutputProblem
from gpucheck.model import results
from gpucheck.model.contract import (
    DEVICE_LABEL_ENV,
    EXIT_CONTEXT_LOST,
    EXIT_OUTPUT_ERROR,
    LIFELINE_FD_ENV,
    NORMAL_EXITS,
    now_iso,
    read_state,
)
from gpucheck.model.layout import RunFolder, WorkerFiles
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.model.runlog import RunLog
from gpucheck.sanitizer import command as sanitizer_cmd
from gpucheck.sanitizer.findings import read_records, sanitizer_findings

STACKS_CHARS = 8000
#: seconds a hung worker has to write its stacks (SIGUSR1) before it is killed
STACK_WAIT_S = 1.0
POLL_S = 0.2
#: workers of one spec killed by a signal before their first case, in a row, that are replaced
MAX_STARTUP_KILLS = 1
#: fresh workers started for one device after crashes before the harness gives up on it
MAX_RESTARTS = 25
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


@dataclass
class Worker:
    spec: WorkerSpec
    proc: subprocess.Popen[bytes]
    state_path: Path
    stdout_path: Path
    stderr_path: Path
    started: float
    generation: int = 0
    base_done: int = 0  # cases of this spec recorded before this worker started
    total: int | None = None  # cases of the first generation
    total_offset: int = 0  # cases recorded before the first generation started (--resume)
    finished: bool = False
    replaced: bool = False
    hung_case: str | None = None
    native: str = ""  # py-spy's native frames of a hung worker, or why there are none
    state: dict[str, Any] = field(default_factory=dict)
    #: workers of this spec killed by a signal in a row before they recorded a case
    startup_kills: int = 0

    @property
    def done(self) -> int:
        return self.base_done + int(self.state.get("done", 0))

    @property
    def planned(self) -> int | None:
        """Cases this worker's spec runs in all, once the first worker has collected them."""
        if self.total is not None:
            return self.total
        collected = self.state.get("total")
        return None if collected is None else int(collected) + self.total_offset


def _plugin_autoloaded() -> bool:
    eps = importlib.metadata.entry_points(group="pytest11")
    return any(ep.value == "gpucheck.pytest_plugin" for ep in eps)


def worker_command(
    spec: WorkerSpec,
    results_path: Path,
    state_path: Path,
    run_id: str,
    skip_path: Path | None = None,
    sanitizer_log: Path | None = None,
) -> list[str]:
    cmd: list[str] = []
    if spec.sanitizer_tool and sanitizer_log is not None:
        cmd += sanitizer_cmd.prefix(spec.sanitizer_tool, sanitizer_log, spec.sanitizer)
    cmd += [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if not any(a == "-s" or a.startswith("--capture") for a in spec.pytest_args):
        # Capture only Python's sys.stdout/err: what native code writes to the fd (libstdc++'s
        # "terminate called after throwing ...", CUDA messages) must reach the worker's
        # stderr file, or it is lost with a process that dies inside a case.
        cmd += ["--capture=sys"]
    # a file that cannot be collected (a syntax or import error) is a finding of its own
    # (the recorder's); the other files and suites still run
    cmd += ["--continue-on-collection-errors"]
    if not _plugin_autoloaded():
        cmd += ["-p", "gpucheck.pytest_plugin"]
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
    if spec.device_index is not None:
        cmd += ["--gpucheck-device", str(spec.device_index)]
    if spec.uuid:
        cmd += ["--gpucheck-device-uuid", spec.uuid]
    if skip_path is not None:
        cmd += ["--gpucheck-skip", str(skip_path)]
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


def write_skip(files: WorkerFiles, skip: list[str] | None) -> Path | None:
    """The file of case ids a fresh worker deselects (already recorded), or None."""
    if not skip:
        return None
    try:
        files.skip.parent.mkdir(parents=True, exist_ok=True)  # a resumed folder may lack it
        files.skip.write_text("\n".join(skip) + "\n")
    except OSError as err:
        raise _cannot_write(files.skip, err) from err
    return files.skip


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


def _cannot_write(path: Path, err: OSError) -> OutputProblem:
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


_LIFELINE: list[int] = []  # this process's pipe (read end, write end), made once


def lifeline() -> int:
    """The read end of the pipe whose write end only this process holds: a worker given it
    sees end-of-file when this process is gone, however it died (gpucheck.worker.guard)."""
    if not _LIFELINE:
        _LIFELINE.extend(os.pipe())  # not inherited, but by the workers it is passed to
    return _LIFELINE[0]


def spawn(
    cmd: list[str], env: dict[str, str], files: WorkerFiles, drop: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """Start one worker process (or rank): its own session (so a hang can be signalled as a
    group), stdout/stderr into its files (appended: :func:`bound_log` cuts them), its command
    line beside them, the controller's lifeline; ``env`` over this process's environment,
    less the variables in ``drop``."""
    try:
        files.folder.mkdir(parents=True, exist_ok=True)
        files.cmd.write_text(" ".join(cmd) + "\n")
    except OSError as problem:
        raise _cannot_write(files.cmd, problem) from problem
    fd = lifeline()
    # the descriptor and the pipe's inode: a tool between us and the worker (compute-sanitizer)
    # may close it, and the number may then name another file in the worker
    full = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": "1",
        **env,
        LIFELINE_FD_ENV: f"{fd}:{os.fstat(fd).st_ino}:{os.getpid()}",
    }
    for name in drop:
        full.pop(name, None)
    with open(files.stdout, "ab") as out, open(files.stderr, "ab") as err:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=err,
            env=full,
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def bound_log(path: Path, cap: int = LOG_CAP, keep: int = LOG_KEEP) -> None:
    """Cut a log past ``cap`` bytes to its first and last ``keep`` bytes (the worker appends,
    so it goes on writing at the new end; what it writes while this cuts may be lost)."""
    try:
        size = path.stat().st_size
        if size <= cap:
            return
        with open(path, "r+b") as f:
            f.seek(size - keep)
            last = f.read(keep)
            f.seek(keep)
            f.write(
                f"\n[gpucheck: {size - 2 * keep} bytes of output cut here; a log is kept "
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


def _alive(pid: int) -> bool:
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


def _signal_name(returncode: int) -> str | None:
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


class Harness:
    """Starts the workers, watches them and writes crash/hang records."""

    def __init__(
        self,
        specs: list[WorkerSpec],
        out_dir: Path,
        results: Path | RunLog,
        run_id: str,
        timeout: float,
        on_update: Callable[[Worker], None] | None = None,
    ) -> None:
        """``results``: the file the workers append to, or the controller's log of it."""
        self.specs = specs
        self.out_dir = out_dir
        self.log = results if isinstance(results, RunLog) else RunLog(results)
        self.results_path = self.log.path
        self.run_id = run_id
        self.timeout = timeout
        self.on_update = on_update
        self.workers: list[Worker] = []

    def start(self) -> None:
        """One worker per spec; cases this run already recorded (``--resume``) are skipped."""
        for spec in self.specs:
            done = self._recorded_cases(spec) if self.results_path.exists() else []
            worker = self._spawn(spec, 0, done)
            if done:
                worker.total_offset = len(done)
            self.workers.append(worker)

    def _spawn(
        self, spec: WorkerSpec, generation: int = 0, skip: list[str] | None = None
    ) -> Worker:
        files = RunFolder(self.out_dir).worker(spec.label, spec.mode, generation)
        env = {DEVICE_LABEL_ENV: spec.label, **spec.env}  # its records' device (node/cuda:1)
        san_log = files.sanitizer_log_template if spec.sanitizer_tool else None
        if spec.sanitizer_tool:
            env.update(sanitizer_cmd.env())
        skip_path = write_skip(files, skip)
        cmd = worker_command(spec, self.results_path, files.state, self.run_id, skip_path, san_log)
        proc = spawn(cmd, env, files)
        return Worker(
            spec,
            proc,
            files.state,
            files.stdout,
            files.stderr,
            time.monotonic(),
            generation,
            base_done=len(skip or []),
        )

    def _recorded_cases(self, spec: WorkerSpec) -> list[str]:
        self.log.refresh()
        return [
            r.case
            for r in self.log.cases
            if r.run_id == self.run_id
            and r.device == spec.label
            and r.mode == spec.mode
            and not r.harness_made
        ]

    def _restart(self, w: Worker, startup_kills: int = 0) -> None:
        """Replace a dead worker by a fresh one that runs the cases not yet recorded."""
        done = self._recorded_cases(w.spec)
        if w.generation >= MAX_RESTARTS:
            total = w.planned
            left = "some" if total is None else str(max(0, total - len(done)))
            self._record(
                w,
                f"<worker {w.spec.label}>",
                "error",
                f"gave up after {MAX_RESTARTS} restarts; {left} case(s) did not run",
                0,
                "worker-error",
                "every restart crashed again: run the suite alone",
            )
            return
        fresh = self._spawn(w.spec, w.generation + 1, done)
        fresh.total = w.planned
        fresh.startup_kills = startup_kills
        w.replaced = True
        self.workers.append(fresh)

    def poll(self) -> bool:
        """One round of watching; True while any worker still runs."""
        for w in self.workers:
            if w.finished:
                continue
            w.state = read_state(w.state_path) or w.state
            for log in (w.stdout_path, w.stderr_path):
                bound_log(log)
            rc = w.proc.poll()
            if rc is None:
                case = w.state.get("case")
                if case and time.time() - float(w.state.get("started", time.time())) > self.timeout:
                    self._kill_hung(w, case)
                    rc = w.proc.returncode
            if rc is not None:
                self._finish(w, rc)
            if self.on_update:
                self.on_update(w)
        return any(not w.finished for w in self.workers)

    def _kill_hung(self, w: Worker, case: str) -> None:
        w.hung_case = case
        if hasattr(signal, "SIGUSR1"):
            # the Python worker's own pid: under compute-sanitizer, w.proc is the tool
            pid = int(w.state.get("pid") or w.proc.pid)
            asked = time.monotonic()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGUSR1)  # faulthandler: every thread's Python stack
            w.native = dumps.py_spy_dump(pid)  # the native frames under them, or why not
            time.sleep(max(0.0, STACK_WAIT_S - (time.monotonic() - asked)))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.proc.pid, signal.SIGKILL)
        w.proc.wait()

    def _finish(self, w: Worker, rc: int) -> None:
        w.finished = True
        w.state = read_state(w.state_path) or w.state
        worker_pid = int(w.state.get("pid") or 0)
        # under compute-sanitizer w.proc is the tool: it ended while the worker under it still
        # runs (the tool crashed)
        tool = (
            bool(w.spec.sanitizer_tool) and worker_pid not in (0, w.proc.pid) and _alive(worker_pid)
        )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.proc.pid, signal.SIGKILL)  # what its cases started and left running
        if tool:  # and the worker the tool left, wherever the tool put it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(worker_pid, signal.SIGKILL)
        for log in (w.stdout_path, w.stderr_path):
            bound_log(log)
        w.state = read_state(w.state_path) or w.state
        case: str | None = w.hung_case or w.state.get("case")
        if rc == EXIT_OUTPUT_ERROR:  # it could not write a record: neither can the others
            raise OutputProblem(output_fault(tail(w.stderr_path), self.out_dir, w.spec.label))
        unclaimed: list[Finding] = []
        if w.spec.sanitizer_tool:
            unclaimed = self._unclaimed_sanitizer_findings(w)
            if rc == sanitizer_cmd.ERROR_EXIT:  # the tool's exit code hides the worker's:
                if w.state.get("exit_reason") == "context-lost":
                    rc = EXIT_CONTEXT_LOST
                elif not case:  # ended normally; its findings are in the case records
                    rc = 1
            if unclaimed and not (case and rc not in NORMAL_EXITS):
                self._unclaimed_record(w, unclaimed)
                unclaimed = []
        if w.hung_case:
            self._record(
                w,
                w.hung_case,
                "hung",
                f"no progress for {self.timeout:g} s; killed",
                rc,
                "hang",
                "the case did not finish within --timeout; the evidence holds "
                "every thread's Python stack at the moment it was stopped and, with "
                "py-spy, the native frames under them",
                unclaimed,
            )
            self._restart(w)
        elif rc == EXIT_CONTEXT_LOST:
            self._restart(w)  # the case's own record already says what happened
        elif rc not in NORMAL_EXITS or case or tool:  # os._exit(0) in a case ends it, too
            sig = _signal_name(rc)
            how = f"killed by {sig}" if sig else f"exited with code {rc}"
            who = (
                f"compute-sanitizer (pid {w.proc.pid})"
                if tool
                else f"compute-sanitizer (pid {w.proc.pid}) or the worker under it"
                if w.spec.sanitizer_tool and not worker_pid
                else "worker"
            )
            if rc == sanitizer_cmd.ERROR_EXIT and w.spec.sanitizer_tool and not tool:
                how = "was ended by compute-sanitizer after a fatal error"
            if case and tool:  # the tool crashed: the case's outcome is unknown, not a crash
                self._record(
                    w,
                    case,
                    "error",
                    f"{who} {how} while this case ran (the worker "
                    f"under it, pid {worker_pid}, was still running)",
                    rc,
                    sanitizer_cmd.TOOL_CRASH,
                    sanitizer_cmd.TOOL_CRASH_HINT,
                    unclaimed,
                )
                self._restart(w)
            elif case:
                other = w.state.get("current_device") not in (None, w.spec.label)
                hint = crash_hint(
                    rc, tail(w.stderr_path, 64_000), bool(w.spec.sanitizer_tool), other
                )
                self._record(
                    w,
                    case,
                    "crashed",
                    f"worker {how} while running this case",
                    rc,
                    "crash",
                    hint,
                    unclaimed,
                )
                self._restart(w)
            else:
                # killed by a signal (the OOM killer, a user) while starting or between cases:
                # a fresh worker runs the cases once more; an exit code (a usage error, a
                # start-up that fails the same way every time) or a second kill in a row ends
                # this device's part of the run
                again = sig is not None and w.startup_kills < MAX_STARTUP_KILLS
                self._record(
                    w,
                    f"<worker {w.spec.label}>",
                    "error",
                    f"{who} {how} outside any case (collection or start-up)"
                    + ("; a fresh worker ran the cases not yet recorded" if again else ""),
                    rc,
                    "worker-error",
                    "see the worker's stderr tail",
                    unclaimed,
                )
                if again:
                    kills = w.startup_kills + (0 if w.state.get("done") else 1)
                    self._restart(w, startup_kills=kills)

    def _unclaimed_sanitizer_findings(self, w: Worker) -> list[Finding]:
        """Records of the worker's sanitizer logs that no finished case claimed."""
        offsets = w.state.get("sanitizer_offsets") or {}
        found: list[Finding] = []
        for log in WorkerFiles.of_state(w.state_path).sanitizer_logs():
            text, _ = read_records(log, int(offsets.get(str(log), 0)), complete_only=False)
            found += [
                f
                for f in sanitizer_findings(text, w.spec.sanitizer_tool, w.spec.label, None, None)
                if f.severity in ("error", "warning")
            ]
        return found

    def _unclaimed_record(self, w: Worker, findings: list[Finding]) -> None:
        suite = str(w.state.get("suite") or ",".join(w.spec.suites))
        case = f"<{w.spec.label} {w.spec.mode}: after the last case>"
        for f in findings:
            f.suite, f.case = suite, case
        record = CaseRecord(
            run_id=self.run_id,
            device=w.spec.label,
            device_uuid=w.spec.uuid,
            suite=suite,
            case=case,
            mode=w.spec.mode,
            status="error",
            reason="compute-sanitizer records outside any case (start-up, shutdown)",
            started_at=now_iso(),
            findings=findings,
        )
        results.append(self.results_path, record.to_json())

    def _record(
        self,
        w: Worker,
        case: str,
        status: str,
        message: str,
        rc: int,
        kind: str,
        hint: str,
        extra: list[Finding] | None = None,
    ) -> None:
        started = float(w.state.get("started", time.time()))
        suite = str(w.state.get("suite") or ",".join(w.spec.suites))
        for f in extra or []:  # sanitizer records the tool wrote before it ended the case
            f.suite, f.case = f.suite or suite, f.case or case
        digest = crash_digest(tail(w.stderr_path, 64_000))
        mine = w.state.get("case") == case
        op = w.state.get("op") if mine else None
        if op:  # the last extension op the case called (the worker's op tracker)
            message = f"{message} (last extension op called: {op})"
        # findings the worker saved before a call that may crash (mixed-device arguments):
        # the crash loses the case's own record, not them; the crash's hint then names them
        pending = [
            Finding(**{**f, "device": w.spec.label, "suite": suite, "case": case})
            for f in (w.state.get("pending_findings") or [])
            if mine
        ]
        mixed = next((f for f in pending if f.kind == "mixed-devices"), None)
        if mixed is not None and kind == "crash":
            hint = cuda_error_hint(mixed, "crash")
        evidence = digest[-2500:]
        if status == "hung":  # stacks first: they say where it hung
            try:  # faulthandler prints the innermost frame first: keep the head
                stacks = WorkerFiles.of_state(w.state_path).stacks.read_text(errors="replace")
            except OSError:
                stacks = ""
            stacks = stacks.strip() or "(no stack dump: the worker did not answer SIGUSR1)"
            evidence = (
                f"--- Python stacks of every thread when stopped (innermost first, "
                f"down to pytest) ---\n{dumps.trim_threads(stacks)[:2500]}\n"
                f"--- native frames (py-spy dump --native) ---\n"
                f"{dumps.trim_threads(w.native)[:2500]}"
            ).strip()
            digest = (
                f"--- Python stacks of every thread when stopped ---\n"
                f"{stacks[:STACKS_CHARS]}\n--- py-spy dump --native ---\n"
                f"{w.native[:STACKS_CHARS]}\n{digest}"
            ).strip()
        record = CaseRecord(
            run_id=self.run_id,
            device=w.spec.label,
            device_uuid=w.spec.uuid,
            suite=suite,
            case=case,
            mode=w.spec.mode,
            status=status,
            reason=message,
            duration_s=round(max(0.0, time.time() - started), 3),
            started_at=now_iso(),
            current_device=w.state.get("current_device"),
            exit_code=rc if rc >= 0 else None,
            signal=_signal_name(rc),
            stderr_tail=digest,
            findings=[
                *(extra or []),
                *pending,
                Finding(
                    kind=kind,
                    severity="error",
                    message=message,
                    device=w.spec.label,
                    suite=suite,
                    case=case,
                    op=op,
                    evidence=evidence or None,
                    hint=hint,
                ),
            ],
        )
        results.append(self.results_path, record.to_json())

    def interrupt(self) -> None:
        """Ctrl-C: ask every worker to stop (pytest finishes its current record), then wait."""
        for w in self.workers:
            if w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.proc.pid, signal.SIGINT)
        deadline = time.monotonic() + 10
        for w in self.workers:
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(w.proc.pid, signal.SIGKILL)
                w.proc.wait()
            w.finished = True

    def run(self) -> None:
        self.start()
        while self.poll():
            time.sleep(POLL_S)
