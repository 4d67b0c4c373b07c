"""The recorder: under ``gpucheck run``, one results.jsonl record per case.

Registered by the plugin when pytest gets ``--gpucheck-results FILE`` (the controller passes
it). Each case is one :class:`~gpucheck.worker.case_state.CaseState` in its item's stash, from
pytest's start of the item to its end, when :meth:`Recorder.build` turns it into the case's
record: the outcome of its phases and its findings reconciled (:mod:`gpucheck.worker.outcome`),
its compute-sanitizer records in a sanitizer pass (:mod:`gpucheck.worker.sanitizer_pass`), its
memory peaks (:mod:`gpucheck.worker.peaks`). The worker also keeps a small state file (current
case, its start time, progress) that the parent reads to attribute a crash or a hang to the
case that was running, and the findings a detector made before a call that may crash
(``pending_findings``: mixed-device arguments).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from gpucheck import processes
from gpucheck.detectors import leak as leak_mod
from gpucheck.detectors import op_watch
from gpucheck.detectors.base import CaseInfo, WorkerContext, detector_error
from gpucheck.detectors.registry import worker_detectors
from gpucheck.errors import OutputProblem
from gpucheck.model import contract, results, worker_state
from gpucheck.model.layout import WorkerFiles
from gpucheck.model.results import BOOKKEEPING, EVIDENCE_CHARS, CaseRecord, Finding, Origin
from gpucheck.model.runlog import CasePlan
from gpucheck.model.shard import ShardError, ShardPlan, case_key
from gpucheck.model.worker_state import WorkerState
from gpucheck.worker import guard
from gpucheck.worker.case import merge, sticky_cuda_error
from gpucheck.worker.case_state import CASE, CaseState
from gpucheck.worker.detector_loop import DetectorLoop
from gpucheck.worker.outcome import lost_context, outcome, reconcile
from gpucheck.worker.peaks import MemoryWatch
from gpucheck.worker.sanitizer_pass import SanitizerPass


class _Shown(NamedTuple):
    """What the state file says now (written again when a detector persists findings)."""

    case: CaseState | None
    exit_reason: str | None = None
    current_device: str | None = None
    op: str | None = None


def _lines(config: pytest.Config, option: str) -> set[str]:
    """The lines of the file an option names (none without the option)."""
    path = config.getoption(option)
    return set(Path(path).read_text().split("\n")) if path else set()


class Recorder:
    """Collects setup/call/teardown reports of each item into one record."""

    def __init__(self, config: pytest.Config) -> None:
        # absolute: a case may change the working folder (guard.changed_state puts it back)
        self.results = Path(config.getoption("--gpucheck-results")).absolute()
        state = config.getoption("--gpucheck-state")
        self.state_path = Path(state).absolute() if state else None
        self.state_file = (
            None if self.state_path is None else worker_state.StateWriter(self.state_path)
        )
        self.pid = os.getpid()
        self.wait_header = bool(config.getoption("--gpucheck-wait-header"))
        guard.watch_controller()
        guard.join_cgroup()  # before any case starts a process
        guard.adopt_orphans()
        #: pid -> start time of the processes the cases left running (the controller ends them)
        self.left: dict[int, int] = {}
        self.skip = _lines(config, "--gpucheck-skip")
        # a rank's cases its peers run (they have no record of theirs): it recorded them, and
        # runs them again, unrecorded, so that the group meets in each
        self.again = _lines(config, "--gpucheck-again")
        shard_file = config.getoption("--gpucheck-shard")
        try:  # --shard I/N: this worker runs only its shard's cases (gpucheck.model.shard)
            self.shard = ShardPlan.read(Path(shard_file)) if shard_file else None
        except ShardError as err:
            raise pytest.UsageError(f"gpucheck: {err}") from None
        devices = config.getoption("--gpucheck-device") or []
        self.origin = Origin(
            config.getoption("--gpucheck-run-id"),
            # distributed runs: "rank1/cuda:1"
            os.environ.get(contract.DEVICE_LABEL_ENV)
            or (f"cuda:{devices[0]}" if devices else "cpu"),
            config.getoption("--gpucheck-mode"),
            config.getoption("--gpucheck-device-uuid"),
        )
        self.device = self.origin.device
        self.device_index: int | None = devices[0] if devices else None
        self.suites = []
        for spec in config.getoption("--gpucheck-suite"):
            name, _, path = spec.partition("=")
            self.suites.append((name, Path(path).resolve()))
        self.rootpath = Path(config.rootpath)
        self.items: dict[str, pytest.Item] = {}  # node id -> the item collected
        self._resolved: dict[str, Path] = {}  # test file as collected -> resolved
        self.ids: dict[str, str] = {}  # node id -> case id (relative to the suite root)
        self.pending: list[Finding] = []  # findings made before a call that may crash
        self.shown = _Shown(None)
        self.detectors = DetectorLoop(worker_detectors())
        sanitizer_tool = config.getoption("--gpucheck-sanitizer-tool")
        context = WorkerContext(
            self.device_index, self.origin.device_uuid, self._persist, sanitizer_tool
        )
        for d in self.detectors.detectors:
            d.bind(context)
        self.done = 0
        self.total = 0
        self.findings = 0
        template = config.getoption("--gpucheck-sanitizer-log")
        self.sanitizer = SanitizerPass(template, sanitizer_tool) if template else None
        self.memory = MemoryWatch(
            self.device_index, self.origin.device_uuid, config.getoption("--gpucheck-nvml-interval")
        )
        if hasattr(signal, "SIGUSR1") and self.state_path is not None:
            # On a hang the parent sends SIGUSR1: every thread's stack goes to this file
            # (pytest captures sys.stderr, so it cannot go there).
            self._stacks = open(WorkerFiles.of_state(self.state_path).stacks, "w")  # noqa: SIM115
            faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)

    # -- the state file -------------------------------------------------------------------

    def _persist(self, findings: list[Finding]) -> None:
        """A detector's findings of the case under way, into the state file now."""
        self.pending = list(findings)
        self._state(*self.shown)

    def _state(
        self,
        case: CaseState | None,
        exit_reason: str | None = None,
        current_device: str | None = None,
        op: str | None = None,
    ) -> None:
        self.shown = _Shown(case, exit_reason, current_device, op)
        if case is None:
            self.pending = []
        if self.state_file is None:
            return
        try:
            self._write_state(case, exit_reason, current_device, op)
        except OSError as err:  # the state would lag the records: stop, like a record
            if exit_reason != worker_state.OUTPUT_ERROR:
                self._output_failed(f"cannot write {self.state_path}: {err.strerror or err}")

    def _write_state(
        self,
        case: CaseState | None,
        exit_reason: str | None,
        current_device: str | None,
        op: str | None,
    ) -> None:
        assert self.state_file is not None
        limited = self.sanitizer.limited if self.sanitizer else None
        self.state_file.write(
            WorkerState(
                case=case.info.case if case else None,
                suite=case.info.suite if case else None,
                current_device=current_device,
                op=op,
                started=case.started_epoch if case else time.time(),
                done=self.done,
                total=self.total,
                findings=self.findings,
                pid=os.getpid(),
                exit_reason=exit_reason,
                sanitizer_offsets=self.sanitizer.offsets if self.sanitizer else {},
                pending_findings=self.pending,
                limit_suite=limited[0] if limited else None,
                limit_case=limited[1] if limited else None,
                children=sorted(self.left.items()),
            ),
        )

    # -- where a case is ------------------------------------------------------------------

    def _path_of(self, nodeid: str) -> Path:
        item = self.items.get(nodeid)
        if item is not None:
            return self.resolved(item)
        return (self.rootpath / nodeid.split("::")[0]).resolve()

    def resolved(self, item: pytest.Item) -> Path:
        """The item's file, resolved once per file (every case of a file asks)."""
        key = str(item.path)
        found = self._resolved.get(key)
        if found is None:
            found = self._resolved[key] = Path(item.path).resolve()
        return found

    def case_id(self, item: pytest.Item) -> str:
        """The item's id relative to its suite's root (``test_knn.py::test_x[cuda0]``): the
        same wherever pytest put its rootdir, so records, resumes and restarts agree."""
        path = self.resolved(item)
        _, _, rest = item.nodeid.partition("::")
        for _, root in self.suites:
            base = root if root.is_dir() else root.parent
            if path == base or base in path.parents:
                rel = path.relative_to(base).as_posix()
                return f"{rel}::{rest}" if rest else rel
        return item.nodeid

    def suite_of(self, item_path: Path) -> str:
        for name, root in self.suites:
            if item_path == root or root in item_path.parents:
                return name
        return item_path.parent.name

    def info(self, nodeid: str) -> CaseInfo:
        """Where case ``nodeid``'s findings go: this worker's device, its suite and id."""
        return self.origin.at(self.suite_of(self._path_of(nodeid)), self.ids.get(nodeid, nodeid))

    def _case(self, nodeid: str) -> CaseState:
        """The case ``nodeid`` under way, in its item's stash (made when first asked for)."""
        item = self.items.get(nodeid)
        if item is not None and CASE in item.stash:
            return item.stash[CASE]
        case = CaseState(nodeid, self.info(nodeid))
        if item is not None:
            item.stash[CASE] = case
        return case

    def _start(self, nodeid: str) -> CaseState:
        """A fresh case ``nodeid``, started now, in its item's stash."""
        case = CaseState(nodeid, self.info(nodeid))
        item = self.items.get(nodeid)
        if item is not None:
            item.stash[CASE] = case
        return case

    def _end(self, nodeid: str) -> CaseState:
        """The case ``nodeid``, out of its item's stash: pytest is done with it."""
        case = self._case(nodeid)
        item = self.items.get(nodeid)
        if item is not None:
            del item.stash[CASE]
        return case

    # -- collection -----------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)  # the shard is split from the whole collection (-k aside)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        self.ids.update({i.nodeid: self.case_id(i) for i in items})
        if self.shard is not None:
            keys = {
                i.nodeid: case_key(self.suite_of(self.resolved(i)), self.ids[i.nodeid])
                for i in items
            }
            mine = self.shard.keep(keys.values())
            config.hook.pytest_deselected(items=[i for i in items if keys[i.nodeid] not in mine])
            items[:] = [i for i in items if keys[i.nodeid] in mine]
        only_file = config.getoption("--gpucheck-only")
        if only_file:
            only = set(Path(only_file).read_text().split("\n"))
            config.hook.pytest_deselected(
                items=[i for i in items if self.ids[i.nodeid] not in only]
            )
            items[:] = [i for i in items if self.ids[i.nodeid] in only]
        if not self.skip:
            return
        skip = self.skip
        keep = [i for i in items if self.ids[i.nodeid] not in skip]
        config.hook.pytest_deselected(items=[i for i in items if self.ids[i.nodeid] in skip])
        items[:] = keep

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = len(session.items)
        self.items = {item.nodeid: item for item in session.items}
        self._append_plan(session.items)
        self._state(None)

    def _append_plan(self, items: list[pytest.Item]) -> None:
        """The ``plan`` record: the cases this worker is about to run (those it will record:
        not the ones it runs again only for its group's sake), before the first of them.
        A run is complete when each has a record (gpucheck.model.runlog)."""
        plan = CasePlan(self.origin.run_id, self.device, self.origin.mode)
        for item in items:
            case = self.ids.get(item.nodeid, item.nodeid)
            if case not in self.again:
                plan.cases.setdefault(self.suite_of(self.resolved(item)), []).append(case)
        self._append(plan.to_json())

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A file of a suite that cannot be collected (a syntax or import error) is a finding
        of its own: the other files and suites still run (``--continue-on-collection-errors``)."""
        if not report.failed or (self.shard is not None and self.shard.index != 1):
            return  # under --shard, shard 1 records it (once for the merged run)
        path = self._path_of(report.nodeid)
        suite = self.suite_of(path)
        case = report.nodeid
        for _, root in self.suites:
            base = root if root.is_dir() else root.parent
            if path == base or base in path.parents:
                case = path.relative_to(base).as_posix() or path.name
        if case in self.skip:  # recorded by an earlier worker of this run
            return
        text = str(report.longrepr)
        last = next(
            (line.strip() for line in reversed(text.splitlines()) if line.strip().startswith("E ")),
            text.strip().splitlines()[-1:] or [""],
        )
        error = (last if isinstance(last, str) else last[0]).removeprefix("E").strip()
        message = f"{case} of suite {suite} cannot be collected: {error}"
        finding = self.origin.at(suite, case).finding(
            results.COLLECTION_ERROR,
            "error",
            message,
            evidence=text[-EVIDENCE_CHARS:],
            hint="none of this file's cases ran: fix the error (a syntax error, a missing "
            "import) and run the suite again",
        )
        record = self.origin.record(suite, case, "error", reason=message, findings=[finding])
        self._append(record.to_json())

    # -- writing --------------------------------------------------------------------------

    def _append(self, record: dict[str, Any]) -> None:
        """Write a record; when it cannot be written (disk full, read-only folder) the worker
        says so in one line and exits with EXIT_OUTPUT_ERROR: the controller stops the run."""
        if self.wait_header:  # once: the header comes first, or not at all (a minute)
            self.wait_header = False
            _header_written(self.results)
        try:
            results.append(self.results, record)
        except OutputProblem as err:
            self._output_failed(str(err))

    def _output_failed(self, why: str) -> None:
        with contextlib.suppress(OSError):
            os.write(2, f"\ngpucheck: {why}\n".encode(errors="replace"))
        with contextlib.suppress(OSError):
            self._state(None, exit_reason=worker_state.OUTPUT_ERROR)
        os._exit(contract.EXIT_OUTPUT_ERROR)

    # -- a case ---------------------------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        case = self._start(nodeid)
        t0 = time.perf_counter()
        case.process_state = guard.ProcessState.now()
        case.allocated_at_start = self.memory.case_started()
        self._state(case)
        case.spent(time.perf_counter() - t0)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        """The detectors watch the body of the case (fixtures have set the stage by then)."""
        t0 = time.perf_counter()
        case = self._case(item.nodeid)
        info = case.info
        current = dict(item.user_properties).get(contract.CURRENT_DEVICE_PROPERTY)
        current = None if current is None else str(current)
        self._state(case, current_device=current)
        tracker = _OpTracker(lambda op: self._state(case, current_device=current, op=op))
        op_watch.add(tracker)
        case.children = set(guard.live_children())
        case.spent(time.perf_counter() - t0)
        self.detectors.start(info, case.findings)
        if self.sanitizer is not None:  # a sanitizer pass: where each call's records lie
            self.sanitizer.trace.begin()
        result = yield
        if guard.is_fork_of(self.pid):  # os.fork() in the case, and the child came back here
            os._exit(0)
        times = _repeats(item, case.findings, info)
        if times > 1 and result.excinfo is None:
            self.detectors.repeat(item.runtest, times)
        op_watch.remove(tracker)
        if self.sanitizer is not None:
            self.sanitizer.trace.end()
        case.op = tracker.raised or tracker.last
        case.raising_op = tracker.raised
        lost = result.excinfo is not None and sticky_cuda_error(result.excinfo[1]) is not None
        case.stood_down = self.detectors.finish(info, case.findings, case.data, lost_context=lost)
        del result

    def add_attached(self, item: pytest.Item, attached: list[Finding], op: str | None) -> None:
        """Findings the case attached (``gpucheck_findings``, ``check_op``), beside its
        detectors' (one finding of each: :func:`gpucheck.worker.case.merge`)."""
        case = self._case(item.nodeid)
        new = merge(case.findings, attached, op)
        for f in new:
            f.device, f.suite, f.case = case.info.device, case.info.suite, case.info.case
        case.findings.extend(new)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._case(report.nodeid).reports.append(report)

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        if guard.is_fork_of(self.pid):  # a fork of this worker writes no record
            os._exit(0)
        case = self._end(nodeid)
        t1 = time.perf_counter()
        self._process_findings(case)
        case.spent(time.perf_counter() - t1)
        record = self.build(case)
        if record.case not in self.again:  # recorded already: run for the group's sake
            self._append(record.to_json())
        self.done += 1
        self.findings += len(record.findings)
        self._state(None)
        if self.sanitizer is not None and self.sanitizer.budget_spent():
            # compute-sanitizer prints a limited number of records per process: the next
            # cases get a fresh one (the controller tells how many records the last case lost)
            self._state(None, exit_reason=worker_state.SANITIZER_LIMIT)
            os._exit(contract.EXIT_SANITIZER_LIMIT)
        if lost_context(case.reports):
            # Every later case in this process would fail with the same error: stop here and
            # let the harness continue in a fresh process.
            sys.stderr.write(f"gpucheck: CUDA context lost in {nodeid}; worker exits\n")
            sys.stderr.flush()
            self._state(None, exit_reason=worker_state.CONTEXT_LOST)
            os._exit(contract.EXIT_CONTEXT_LOST)

    def _process_findings(self, case: CaseState) -> None:
        """Warnings for what the case did to the worker process: a working folder or a CUDA
        variable it changed (put back here, so later cases are not affected), processes its
        body started and left running."""
        before = case.process_state
        changes = guard.changed_state(before) if before is not None else []
        if changes:
            case.findings.append(
                case.info.finding(
                    "process-state",
                    "warning",
                    f"the case changed {'; '.join(changes)} and did not put it back",
                    hint="gpucheck put it back before the next case; use monkeypatch.chdir / "
                    "monkeypatch.setenv, which undo themselves",
                )
            )
        live = guard.live_children()
        self._remember(live)
        earlier = case.children
        stray = {p: c for p, c in live.items() if earlier is not None and p not in earlier}
        if stray:
            case.findings.append(
                case.info.finding(
                    "stray-process",
                    "warning",
                    f"the case left {len(stray)} process(es) running: "
                    + "; ".join(f"pid {p}: {c}" for p, c in sorted(stray.items())),
                    hint="wait for (or end) the processes a test starts; gpucheck ends them "
                    "with the worker",
                )
            )

    def _remember(self, live: dict[int, str]) -> None:
        """Keep the processes running now in the state file (written with the case's end):
        what the controller ends when this worker ends, wherever they moved (a session of
        their own) and however the worker ends."""
        self.left = {
            pid: start for pid in live if (start := processes.start_ticks(pid)) is not None
        }

    @pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if guard.is_fork_of(self.pid):
            return
        self._remember(guard.live_children())
        self._state(None)

    def build(self, case: CaseState) -> CaseRecord:
        """The case's record, in one place: the outcome of its phases with its findings
        reconciled, its compute-sanitizer records (a sanitizer pass), its memory peaks, what
        its detectors added and the worker's own seconds on it."""
        duration = time.monotonic() - case.started
        info = case.info
        out = outcome(case.reports, info, case.op, case.raising_op)
        findings = reconcile(out, case.findings, case.stood_down)
        if self.sanitizer is not None:
            found = self.sanitizer.findings(info, out.other_current(self.device))
            findings.extend(found)
            out.fail(found, "compute-sanitizer")
        memory, nvml_failed = self.memory.case_finished(info, case.allocated_at_start)
        if nvml_failed is not None:
            findings.append(nvml_failed)
        case.data.charge({BOOKKEEPING: case.bookkeeping})
        case.data.cost_s = {name: round(s, 6) for name, s in case.data.cost_s.items()}
        return self.origin.record(
            info.suite,
            info.case,
            out.status,
            reason=out.reason,
            started_at=case.started_at,
            duration_s=round(duration, 6),
            current_device=out.current,
            memory=memory,
            findings=findings,
            data=case.data,
        )


#: seconds a worker waits for the run's header before its first record (the controller
#: writes it a few milliseconds after starting the worker; it ends the worker if it fails)
HEADER_WAIT_S = 60.0


def _header_written(path: Path, timeout: float = HEADER_WAIT_S) -> bool:
    """Wait until the results file holds something (the run's header, the controller's first
    line: a record never comes before it); False when it still did not after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            if os.stat(path).st_size > 0:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


class _OpTracker:
    """Keeps the extension op being called in the state file, so that a crash or a hang
    inside it names the op (written when the op changes, not on every call)."""

    name = BOOKKEEPING  # its seconds around the calls are the worker's bookkeeping

    def __init__(self, write: Any) -> None:
        self.write = write
        self.last: str | None = None
        self.raised: str | None = None  # the first op whose call raised

    def before(self, call: op_watch.Call) -> None:
        if call.op != self.last:
            self.last = call.op
            self.write(call.op)

    def after(self, call: op_watch.Call, out: Any) -> None:
        if call.error is not None and self.raised is None:
            self.raised = call.op


def _repeats(item: pytest.Item, found: list[Finding], info: CaseInfo) -> int:
    """How often a case runs (``gpucheck_repeat``); a bad marker is a finding, run once."""
    try:
        return leak_mod.repeats(item)
    except ValueError as err:
        found.append(detector_error("leak", err, info))
        return 1
