"""Parent side: one pytest worker process per target device, all running at once (the loop
that watches them; how one is started: :mod:`.spawning`; what its death means:
:mod:`.deaths`).

Each worker appends its own case records to results.jsonl. The parent watches every worker's
state file: a case that runs past the timeout gets every thread's Python stack dumped
(SIGUSR1 -> faulthandler) and the worker killed, and becomes a ``hung`` record; a worker that
dies (signal, abort) becomes a ``crashed`` record for the case it was in, with the exit code or
signal and the tail of its stderr. Either way a fresh worker is started for that device and
continues with the cases not yet recorded. A worker whose CUDA context is lost (a sticky
error such as an illegal address) records that case as failed and exits with
EXIT_CONTEXT_LOST so that it, too, is replaced. Other devices' workers are not affected. A
sanitizer pass's worker whose logs near compute-sanitizer's print limit exits with
EXIT_SANITIZER_LIMIT after a case and is replaced too (not counted as a restart after a
crash); when the limit was reached during its last case, the records the tool did not print
(its summary) become a finding of that case (a diagnosis record).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from gpucheck.controller import stacks as dumps
from gpucheck.controller.deaths import (
    DEATHS,
    WorkerEnd,
    crash_digest,
    crash_hint,
    hang_evidence,
    output_fault,
    signal_name,
)
from gpucheck.controller.spawning import (
    WorkerSpec,
    alive,
    bound_log,
    end_left,
    left_note,
    spawn,
    tail,
    worker_command,
    write_skip,
)
from gpucheck.errors import OutputProblem
from gpucheck.model import results, worker_state
from gpucheck.model.contract import DEVICE_LABEL_ENV
from gpucheck.model.kinds import CRASH, HANG, WORKER_ERROR
from gpucheck.model.layout import RunFolder, WorkerFiles
from gpucheck.model.results import Finding, Origin
from gpucheck.model.runlog import Diagnosis, RunLog
from gpucheck.model.worker_state import WorkerState
from gpucheck.processes import Cgroup, Proc, descendants
from gpucheck.sanitizer import command as sanitizer_cmd
from gpucheck.sanitizer import open_calls
from gpucheck.sanitizer.command import SANITIZER_CRASH
from gpucheck.sanitizer.findings import (
    crash_findings,
    dropped_finding,
    read_records,
    sanitizer_findings,
)

#: seconds a hung worker has to write its stacks (SIGUSR1) before it is killed
STACK_WAIT_S = 1.0
POLL_S = 0.2
#: workers of one spec killed by a signal before their first case, in a row, that are replaced
MAX_STARTUP_KILLS = 1
#: fresh workers started for one device after crashes before the harness gives up on it
MAX_RESTARTS = 25
#: the status of the record the harness writes for a worker's death
DeathStatus = Literal["hung", "crashed", "error"]
HANG_HINT = (
    "the case did not finish within --timeout; the evidence holds every thread's Python "
    "stack at the moment it was stopped and, with py-spy, the native frames under them"
)


@dataclass
class Worker:
    spec: WorkerSpec
    proc: subprocess.Popen[bytes]
    state_path: Path
    stdout_path: Path
    stderr_path: Path
    started: float
    generation: int = 0
    first_generation: int = 0  # its chain's first (a resumed run's continue the run's)
    base_done: int = 0  # cases of this spec recorded before this worker started
    total: int | None = None  # cases of the first generation
    total_offset: int = 0  # cases recorded before the first generation started (--resume)
    finished: bool = False
    replaced: bool = False
    hung_case: str | None = None
    native: str = ""  # py-spy's native frames of a hung worker, or why there are none
    worker_error: bool = False  # it ended outside any case: a ``worker-error`` record says why
    state: WorkerState = field(default_factory=WorkerState)
    #: workers of this spec killed by a signal in a row before they recorded a case
    startup_kills: int = 0
    #: fresh workers of this spec started for a fresh compute-sanitizer (not after a crash)
    limit_restarts: int = 0
    cgroup: Cgroup | None = None  # the one made for it (what its cases start is in it)
    #: its descendants as the controller saw them before it killed it (a hang, Ctrl-C)
    seen: list[Proc] = field(default_factory=list)

    @property
    def done(self) -> int:
        return self.base_done + self.state.done

    @property
    def restarts(self) -> int:
        """Fresh workers of its chain before it (in this invocation of the run)."""
        return self.generation - self.first_generation

    @property
    def planned(self) -> int | None:
        """Cases this worker's spec runs in all, once the first worker has collected them."""
        if self.total is not None:
            return self.total
        collected = self.state.total
        return None if collected is None else collected + self.total_offset


def _started(state: WorkerState) -> float:
    """When the worker's case started (now, where its state does not say)."""
    return state.started if state.started is not None else time.time()


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
        on_start: Callable[[], None] | None = None,
        wait_header: bool = False,
    ) -> None:
        """``results``: the file the workers append to, or the controller's log of it.
        ``on_start``: called once the first workers are started (what the controller does
        while they start: a worker takes a few hundred milliseconds to its first case).
        ``wait_header``: the run's header is not written yet (``on_start`` writes it): the
        first workers append no record before it is there."""
        self.specs = specs
        self.on_start = on_start
        self.wait_header = wait_header
        self.out_dir = out_dir
        self.log = results if isinstance(results, RunLog) else RunLog(results)
        self.results_path = self.log.path
        self.run_id = run_id
        self.timeout = timeout
        self.on_update = on_update
        self.workers: list[Worker] = []
        self.notes: list[str] = []  # what the run's notes say of this harness's workers

    def start(self) -> None:
        """One worker per spec; cases this run already recorded (``--resume``) are skipped,
        and its files are numbered after those of the run's earlier workers."""
        for spec in self.specs:
            done = self._recorded_cases(spec) if self.results_path.exists() else []
            first = RunFolder(self.out_dir).next_generation(spec.label, spec.mode)
            worker = self._spawn(spec, first, done, wait_header=self.wait_header)
            worker.first_generation = first
            if done:
                worker.total_offset = len(done)
            self.workers.append(worker)
        if self.on_start is not None:
            self.on_start()

    def _spawn(
        self,
        spec: WorkerSpec,
        generation: int = 0,
        skip: list[str] | None = None,
        wait_header: bool = False,
    ) -> Worker:
        files = RunFolder(self.out_dir).worker(spec.label, spec.mode, generation)
        env = {DEVICE_LABEL_ENV: spec.label, **spec.env}  # its records' device (node/cuda:1)
        san_log = files.sanitizer_log_template if spec.sanitizer_tool else None
        if spec.sanitizer_tool:
            env.update(sanitizer_cmd.env())
        skip_path = write_skip(files, skip)
        cgroup = Cgroup.make(files.stem)
        cmd = worker_command(
            spec,
            self.results_path,
            files.state,
            self.run_id,
            skip_path,
            san_log,
            wait_header,
            quick_exit=True,
        )
        proc = spawn(cmd, env, files, cgroup=cgroup)
        return Worker(
            spec,
            proc,
            files.state,
            files.stdout,
            files.stderr,
            time.monotonic(),
            generation,
            base_done=len(skip or []),
            cgroup=cgroup,
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

    def _restart(
        self, w: Worker, end: WorkerEnd, startup_kills: int = 0, limit: bool = False
    ) -> None:
        """Replace a dead worker by a fresh one that runs the cases not yet recorded
        (``limit``: one that ended for a fresh compute-sanitizer, not after a crash)."""
        done = self._recorded_cases(w.spec)
        if w.restarts - w.limit_restarts >= MAX_RESTARTS:
            total = w.planned
            left = "some" if total is None else str(max(0, total - len(done)))
            self._record(
                w,
                f"<worker {w.spec.label}>",
                "error",
                f"gave up after {MAX_RESTARTS} restarts; {left} case(s) did not run",
                replace(end, rc=0),
                WORKER_ERROR.name,
                "every restart crashed again: run the suite alone",
            )
            return
        fresh = self._spawn(w.spec, w.generation + 1, done)
        fresh.first_generation = w.first_generation
        fresh.total = w.planned
        fresh.startup_kills = startup_kills
        fresh.limit_restarts = w.limit_restarts + int(limit)
        w.replaced = True
        self.workers.append(fresh)

    def poll(self) -> bool:
        """One round of watching; True while any worker still runs."""
        for w in self.workers:
            if w.finished:
                continue
            w.state = worker_state.read(w.state_path) or w.state
            for log in (w.stdout_path, w.stderr_path):
                bound_log(log)
            rc = w.proc.poll()
            if rc is None:
                case = w.state.case
                if case and time.time() - _started(w.state) > self.timeout:
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
            pid = w.state.pid or w.proc.pid
            asked = time.monotonic()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGUSR1)  # faulthandler: every thread's Python stack
            w.native = dumps.py_spy_dump(pid)  # the native frames under them, or why not
            time.sleep(max(0.0, STACK_WAIT_S - (time.monotonic() - asked)))
        w.seen = _descendants(w)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.proc.pid, signal.SIGKILL)
        w.proc.wait()

    def _finish(self, w: Worker, rc: int) -> None:
        """What the worker's end means (:class:`~.deaths.WorkerEnd`), acted on: a record of
        the case it died or hung in, or of its death outside any case, and a fresh worker
        for the cases not yet recorded."""
        w.finished = True
        end = self._ended(w, rc)
        ending = end.ending
        if ending == "output-error":  # it could not write a record: neither can the others
            raise OutputProblem(output_fault(end.stderr, self.out_dir, w.spec.label))
        unclaimed = self._unclaimed_sanitizer_findings(w, end) if w.spec.sanitizer_tool else []
        if unclaimed and not end.in_case:  # else they go on the record of its case
            self._unclaimed_record(w, unclaimed)
            unclaimed = []
        if ending in DEATHS:
            self._record_death(w, end, unclaimed)
            self._restart(w, end)
        elif ending == "context-lost":
            self._restart(w, end)  # the case's own record already says what happened
        elif ending == "sanitizer-limit":
            self._limit_reached(w)
            if w.planned is None or w.done < w.planned:
                self._restart(w, end, limit=True)
        elif ending == "worker-error":
            self._worker_error(w, end, unclaimed)

    def _ended(self, w: Worker, rc: int) -> WorkerEnd:
        """End what the worker left (its process group; under compute-sanitizer, the worker
        the tool left running when the tool itself ended), then read its last state and its
        stderr once."""
        worker_pid = w.state.pid or 0  # its state as the poll that saw it end read it
        # under compute-sanitizer w.proc is the tool: it ended while the worker under it still
        # runs (the tool crashed)
        tool = (
            bool(w.spec.sanitizer_tool) and worker_pid not in (0, w.proc.pid) and alive(worker_pid)
        )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.proc.pid, signal.SIGKILL)  # what its cases started and left running
        if tool:  # and the worker the tool left, wherever the tool put it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(worker_pid, signal.SIGKILL)
        for log in (w.stdout_path, w.stderr_path):
            bound_log(log)
        w.state = worker_state.read(w.state_path) or w.state
        self._end_left(w)
        return WorkerEnd.of(
            rc,
            w.state,
            w.hung_case,
            bool(w.spec.sanitizer_tool),
            tool,
            w.proc.pid,
            tail(w.stderr_path, 64_000),
        )

    def _record_death(self, w: Worker, end: WorkerEnd, unclaimed: list[Finding]) -> None:
        """The record of the case the worker hung or died in (``unclaimed``: sanitizer
        records the tool wrote before it ended the case)."""
        case = end.case or ""
        if end.hung:
            status: DeathStatus = "hung"
            message = f"no progress for {self.timeout:g} s; killed"
            kind, hint = HANG.name, HANG_HINT
        elif end.tool_crashed:  # the case's outcome is unknown, not a crash
            status, kind, hint = "error", SANITIZER_CRASH.name, sanitizer_cmd.TOOL_CRASH_HINT
            message = (
                f"{end.who} {end.how} while this case ran (the worker "
                f"under it, pid {end.worker_pid}, was still running)"
            )
        else:
            other = w.state.current_device not in (None, w.spec.label)
            status, kind = "crashed", CRASH.name
            hint = crash_hint(end.rc, end.stderr, end.sanitizer, other)
            message = f"worker {end.how} while running this case"
        self._record(w, case, status, message, end, kind, hint, unclaimed)

    def _worker_error(self, w: Worker, end: WorkerEnd, unclaimed: list[Finding]) -> None:
        """A worker that died outside any case: killed by a signal (the OOM killer, a user)
        while starting or between cases, a fresh worker runs the cases once more; an exit
        code (a usage error, a start-up that fails the same way every time) or a second kill
        in a row ends this device's part of the run."""
        again = signal_name(end.rc) is not None and w.startup_kills < MAX_STARTUP_KILLS
        w.worker_error = True
        self._record(
            w,
            f"<worker {w.spec.label}>",
            "error",
            f"{end.who} {end.how} outside any case (collection or start-up)"
            + ("; a fresh worker ran the cases not yet recorded" if again else ""),
            end,
            WORKER_ERROR.name,
            "see the worker's stderr tail",
            unclaimed,
        )
        if again:
            self._restart(w, end, startup_kills=w.startup_kills + (0 if w.state.done else 1))

    def _limit_reached(self, w: Worker) -> None:
        """The records compute-sanitizer did not print during the case its worker's state
        names (its logs' summaries), as a diagnosis record of that case."""
        suite, case = w.state.limit_suite, w.state.limit_case
        if not (suite and case):
            return  # ended before the limit: nothing was dropped
        texts = []
        for log in WorkerFiles.of_state(w.state_path).sanitizer_logs():
            with contextlib.suppress(OSError):
                texts.append(read_records(log, 0, complete_only=False)[0])
        finding = dropped_finding(texts, w.spec.label, suite, case)
        if finding is not None:
            diagnosis = Diagnosis(self.run_id, w.spec.label, suite, case, w.spec.mode, [finding])
            results.append(self.results_path, diagnosis.to_json())

    def _unclaimed_sanitizer_findings(self, w: Worker, end: WorkerEnd) -> list[Finding]:
        """Records of the worker's sanitizer logs that no finished case claimed; where it
        ended inside a case, the invalid accesses among them traced to the calls it had
        under way (a memcheck pass writes them beside its logs)."""
        offsets = w.state.sanitizer_offsets
        files = WorkerFiles.of_state(w.state_path)
        under_way = (
            open_calls.read(open_calls.path_for(files.sanitizer_log_template)) if end.case else []
        )
        where = self._origin(w).at(w.state.suite or ",".join(w.spec.suites), end.case or "")
        tool = w.spec.sanitizer_tool
        found: list[Finding] = []
        for log in files.sanitizer_logs():
            text, _ = read_records(log, offsets.get(str(log), 0), complete_only=False)
            found += crash_findings(str(log), text, tool, under_way, where)
            found += [
                f
                for f in sanitizer_findings(text, tool, w.spec.label, None, None)
                if f.severity in ("error", "warning")
            ]
        return found

    def _origin(self, w: Worker) -> Origin:
        """Who records ``w``'s cases (its device and mode in this run)."""
        return Origin(self.run_id, w.spec.label, w.spec.mode, w.spec.uuid)

    def _unclaimed_record(self, w: Worker, findings: list[Finding]) -> None:
        suite = w.state.suite or ",".join(w.spec.suites)
        case = f"<{w.spec.label} {w.spec.mode}: after the last case>"
        for f in findings:
            f.suite, f.case = suite, case
        record = self._origin(w).record(
            suite,
            case,
            "error",
            reason="compute-sanitizer records outside any case (start-up, shutdown)",
            findings=findings,
        )
        results.append(self.results_path, record.to_json())

    def _record(
        self,
        w: Worker,
        case: str,
        status: DeathStatus,
        message: str,
        end: WorkerEnd,
        kind: str,
        hint: str,
        extra: list[Finding] | None = None,
    ) -> None:
        """The record of a worker's death: ``end`` says how it ended (``rc`` as recorded)."""
        rc = end.rc
        started = _started(w.state)
        suite = w.state.suite or ",".join(w.spec.suites)
        for f in extra or []:  # sanitizer records the tool wrote before it ended the case
            f.suite, f.case = f.suite or suite, f.case or case
        digest = crash_digest(end.stderr)
        mine = w.state.case == case
        op = w.state.op if mine else None
        if op:  # the last extension op the case called (the worker's op tracker)
            message = f"{message} (last extension op called: {op})"
        # findings the worker saved before a call that may crash (mixed-device arguments):
        # the crash loses the case's own record, not them; the crash's hint then names them
        pending = [
            replace(f, device=w.spec.label, suite=suite, case=case)
            for f in w.state.pending_findings
            if mine
        ]
        mixed = next((f for f in pending if f.kind == results.MIXED_DEVICES), None)
        if mixed is not None and kind == CRASH.name:
            hint = results.mixed_devices_hint(mixed, "crash")
        evidence = digest[-2500:]
        if status == "hung":  # stacks first: they say where it hung
            try:
                stacks = WorkerFiles.of_state(w.state_path).stacks.read_text(errors="replace")
            except OSError:
                stacks = ""
            evidence, digest = hang_evidence(stacks, w.native, digest)
        origin = self._origin(w)
        record = origin.record(
            suite,
            case,
            status,
            reason=message,
            duration_s=round(max(0.0, time.time() - started), 3),
            current_device=w.state.current_device,
            exit_code=rc if rc >= 0 else None,
            signal=signal_name(rc),
            stderr_tail=digest,
            findings=[
                *(extra or []),
                *pending,
                origin.at(suite, case).finding(
                    kind, "error", message, op=op, evidence=evidence or None, hint=hint
                ),
            ],
        )
        results.append(self.results_path, record.to_json())

    def interrupt(self) -> None:
        """Ctrl-C: ask every worker to stop (pytest finishes its current record), then wait;
        then end what their cases left running."""
        running = [w for w in self.workers if w.proc.poll() is None]
        for w in running:
            w.seen = _descendants(w)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.proc.pid, signal.SIGINT)
        deadline = time.monotonic() + 10
        for w in self.workers:
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(w.proc.pid, signal.SIGKILL)
                w.proc.wait()
            if not w.finished:
                w.state = worker_state.read(w.state_path) or w.state
                self._end_left(w)
            w.finished = True

    def _end_left(self, w: Worker) -> None:
        """End what the worker's cases left running, in sessions of their own too (its
        process group is ended already); a note names each."""
        ended = end_left(w.cgroup, w.state, w.seen)
        if ended:
            self.notes.append(left_note(f"{w.spec.label} {w.spec.mode}", ended))

    def run(self) -> None:
        self.start()
        while self.poll():
            self._wait()

    def _wait(self) -> None:
        """Up to POLL_S, less when a worker ends first: the run's end is seen at once."""
        running = [w for w in self.workers if not w.finished]
        if running:
            wait_any([w.proc for w in running], POLL_S)


def _descendants(w: Worker) -> list[Proc]:
    """The worker's processes and theirs, as they are now (before it is killed)."""
    pid = w.state.pid or w.proc.pid
    return [p for d in descendants(pid) if (p := Proc.of(d)) is not None]


def wait_any(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """Until one of ``procs`` ends or ``timeout`` seconds pass: at once where the system
    says when a process ends (a pidfd, Linux 5.3), else ``Popen.wait`` on the first, which
    looks every few milliseconds (up to 50 ms late)."""
    fds: list[int] = []
    try:
        for proc in procs:
            fds.append(os.pidfd_open(proc.pid))
    except (AttributeError, OSError):  # no pidfd here, or the process is reaped already
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(subprocess.TimeoutExpired):
            procs[0].wait(timeout=timeout)
        return
    try:
        select.select(fds, [], [], timeout)
    finally:
        for fd in fds:
            os.close(fd)
