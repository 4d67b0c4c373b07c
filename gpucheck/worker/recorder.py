"""The recorder: under ``gpucheck run``, one results.jsonl record per case.

Registered by the plugin when pytest gets ``--gpucheck-results FILE`` (the controller passes
it). The worker
also keeps a small state file (current case, its start time, progress) that the parent reads
to attribute a crash or a hang to the case that was running, and the findings a detector made
before a call that may crash (``pending_findings``: mixed-device arguments).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpucheck import nvml
from gpucheck.detectors import leak as leak_mod
from gpucheck.detectors import op_watch
from gpucheck.detectors.base import CaseInfo, WorkerContext, detector_error
from gpucheck.detectors.registry import worker_detectors
from gpucheck.errors import CUDA_ERROR_MARKERS, OutputProblem, sticky_cuda_error_line
from gpucheck.model import clock, contract, results, worker_state
from gpucheck.model.fleet import WorkerPlan
from gpucheck.model.layout import WorkerFiles
from gpucheck.model.results import BOOKKEEPING, EVIDENCE_CHARS, CaseRecord, Finding
from gpucheck.model.shard import ShardError, ShardPlan, case_key
from gpucheck.model.worker_state import WorkerState
from gpucheck.nvml_sampler import CasePeaks, Sampler
from gpucheck.sanitizer.findings import read_records, sanitizer_findings
from gpucheck.worker import guard
from gpucheck.worker.case import merge, sticky_cuda_error
from gpucheck.worker.detector_loop import DetectorLoop, stood_down_note


def _torch_cuda() -> Any:
    """torch.cuda if this process already initialized CUDA, else None (never initializes it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda


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
        skip_file = config.getoption("--gpucheck-skip")
        self.skip = set(Path(skip_file).read_text().split("\n")) if skip_file else set()
        shard_file = config.getoption("--gpucheck-shard")
        try:  # --shard I/N: this worker runs only its shard's cases (gpucheck.model.shard)
            self.shard = ShardPlan.read(Path(shard_file)) if shard_file else None
        except ShardError as err:
            raise pytest.UsageError(f"gpucheck: {err}") from None
        self.process_state: dict[str, guard.ProcessState] = {}
        self.children: dict[str, set[int]] = {}  # node id -> children before its body ran
        self.run_id = config.getoption("--gpucheck-run-id")
        self.mode = config.getoption("--gpucheck-mode")
        self.uuid = config.getoption("--gpucheck-device-uuid")
        devices = config.getoption("--gpucheck-device") or []
        self.device = os.environ.get(contract.DEVICE_LABEL_ENV) or (
            f"cuda:{devices[0]}" if devices else "cpu"
        )  # distributed runs: "rank1/cuda:1"
        self.device_index: int | None = devices[0] if devices else None
        self.suites = []
        for spec in config.getoption("--gpucheck-suite"):
            name, _, path = spec.partition("=")
            self.suites.append((name, Path(path).resolve()))
        self.rootpath = Path(config.rootpath)
        self.paths: dict[str, Path] = {}  # node id -> test file
        self._resolved: dict[str, Path] = {}  # test file as collected -> resolved
        self.ids: dict[str, str] = {}  # node id -> case id (relative to the suite root)
        self.reports: dict[str, list[pytest.TestReport]] = {}
        self.started: dict[str, tuple[float, str, float]] = {}  # monotonic, iso, epoch
        self.allocated_at_start: dict[str, int] = {}  # PyTorch allocated on the target
        self.detectors = DetectorLoop(worker_detectors())
        self.pending: list[Finding] = []  # findings made before a call that may crash
        self.last_state: dict[str, Any] = {}
        context = WorkerContext(
            self.device_index,
            self.uuid,
            self._persist,
            config.getoption("--gpucheck-sanitizer-tool"),
        )
        for d in self.detectors.detectors:
            d.bind(context)
        self.detector_findings: dict[str, list[Finding]] = {}
        self.detector_data: dict[str, dict[str, Any]] = {}  # node id -> fields of its record
        self.case_ops: dict[str, str] = {}  # node id -> the last extension op it called
        self.stood_down: dict[str, list[str]] = {}  # node id -> detectors that stood down
        self.raising_ops: dict[str, str] = {}  # node id -> the extension op that raised
        self.bookkeeping: dict[str, float] = {}  # node id -> seconds of the recorder's own
        self.done = 0
        self.total = 0
        self.findings = 0
        template = config.getoption("--gpucheck-sanitizer-log")
        # compute-sanitizer names logs after a pid of its own choosing (not always ours), and
        # a case's child processes get their own: follow every log of this worker.
        self.san_glob = Path(template.replace("%p", "*")).absolute() if template else None
        self.san_tool = config.getoption("--gpucheck-sanitizer-tool")
        self.san_offsets: dict[str, int] = {}
        self.peaks: CasePeaks | None = None
        self.sampler: Sampler | None = None
        interval = config.getoption("--gpucheck-nvml-interval")
        if interval > 0 and nvml.status().ok:
            self.peaks = CasePeaks()
            self.sampler = Sampler(interval, self.peaks, pid=os.getpid()).start()
        if hasattr(signal, "SIGUSR1") and self.state_path is not None:
            # On a hang the parent sends SIGUSR1: every thread's stack goes to this file
            # (pytest captures sys.stderr, so it cannot go there).
            self._stacks = open(WorkerFiles.of_state(self.state_path).stacks, "w")  # noqa: SIM115
            faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)

    def _persist(self, findings: list[Finding]) -> None:
        """A detector's findings of the case under way, into the state file now."""
        self.pending = list(findings)
        self._state(**self.last_state)

    def _state(
        self,
        case: str | None,
        exit_reason: str | None = None,
        current_device: str | None = None,
        op: str | None = None,
    ) -> None:
        self.last_state = {
            "case": case,
            "exit_reason": exit_reason,
            "current_device": current_device,
            "op": op,
        }
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
        self, case: str | None, exit_reason: str | None, current_device: str | None, op: str | None
    ) -> None:
        assert self.state_file is not None
        self.state_file.write(
            WorkerState(
                case=self.ids.get(case, case) if case else None,
                suite=self.suite_of(self._path_of(case)) if case else None,
                current_device=current_device,
                op=op,
                started=self.started[case][2] if case in self.started else time.time(),
                done=self.done,
                total=self.total,
                findings=self.findings,
                pid=os.getpid(),
                exit_reason=exit_reason,
                sanitizer_offsets=self.san_offsets,
                pending_findings=self.pending,
            ),
        )

    def _path_of(self, nodeid: str) -> Path:
        if nodeid in self.paths:
            return self.paths[nodeid]
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

    def _sanitizer_findings(self, case: str, suite: str, other_current: bool) -> list[Finding]:
        """Records compute-sanitizer wrote to this process's log while the case ran."""
        cuda = _torch_cuda()
        if cuda is not None:
            with contextlib.suppress(RuntimeError):  # a lost context: the log is all there is
                cuda.synchronize()
        assert self.san_glob is not None
        found: list[Finding] = []
        for log in sorted(self.san_glob.parent.glob(self.san_glob.name)):
            text, end = read_records(log, self.san_offsets.get(str(log), 0))
            self.san_offsets[str(log)] = end
            if text:
                found += sanitizer_findings(
                    text, self.san_tool, self.device, suite, case, other_current
                )
        return found

    def suite_of(self, item_path: Path) -> str:
        for name, root in self.suites:
            if item_path == root or root in item_path.parents:
                return name
        return item_path.parent.name

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
        self.paths = {item.nodeid: self.resolved(item) for item in session.items}
        if self.state_path is not None:  # what a lost node did not finish (gpucheck.model.fleet)
            with contextlib.suppress(OSError):
                plan = [self.ids.get(i.nodeid, i.nodeid) for i in session.items]
                WorkerPlan(self.device, self.mode, plan).write(
                    WorkerFiles.of_state(self.state_path).plan
                )
        self._state(None)

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
        record = CaseRecord(
            run_id=self.run_id,
            device=self.device,
            device_uuid=self.uuid,
            suite=suite,
            case=case,
            mode=self.mode,
            status="error",
            reason=message,
            started_at=clock.now(),
            findings=[
                Finding(
                    kind="collection-error",
                    severity="error",
                    message=message,
                    device=self.device,
                    suite=suite,
                    case=case,
                    evidence=text[-EVIDENCE_CHARS:],
                    hint="none of this file's cases ran: fix the error (a syntax "
                    "error, a missing import) and run the suite again",
                )
            ],
        )
        self._append(record)

    def _append(self, record: CaseRecord) -> None:
        """Write a record; when it cannot be written (disk full, read-only folder) the worker
        says so in one line and exits with EXIT_OUTPUT_ERROR: the controller stops the run."""
        if self.wait_header:  # once: the header comes first, or not at all (a minute)
            self.wait_header = False
            _header_written(self.results)
        try:
            results.append(self.results, record.to_json())
        except OutputProblem as err:
            self._output_failed(str(err))

    def _output_failed(self, why: str) -> None:
        with contextlib.suppress(OSError):
            os.write(2, f"\ngpucheck: {why}\n".encode(errors="replace"))
        with contextlib.suppress(OSError):
            self._state(None, exit_reason=worker_state.OUTPUT_ERROR)
        os._exit(contract.EXIT_OUTPUT_ERROR)

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.started[nodeid] = (time.monotonic(), clock.now(), time.time())
        t0 = time.perf_counter()
        self.process_state[nodeid] = guard.ProcessState.now()
        cuda = _torch_cuda()
        if cuda is not None and self.device_index is not None:
            cuda.reset_peak_memory_stats(self.device_index)  # the target's, whatever is current
            # what earlier cases left allocated: the case's own peak is the peak above it
            self.allocated_at_start[nodeid] = int(cuda.memory_allocated(self.device_index))
        if self.peaks is not None and self.sampler is not None:
            self.peaks.reset()
            self.peaks(time.time(), self.sampler.sample())
        self._state(nodeid)
        self.bookkeeping[nodeid] = time.perf_counter() - t0

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        """The detectors watch the body of the case (fixtures have set the stage by then)."""
        t0 = time.perf_counter()
        info = CaseInfo(
            self.device,
            self.suite_of(self.resolved(item)),
            self.ids.get(item.nodeid, item.nodeid),
        )
        current = dict(item.user_properties).get(contract.CURRENT_DEVICE_PROPERTY)
        current = None if current is None else str(current)
        self._state(item.nodeid, current_device=current)
        tracker = _OpTracker(lambda op: self._state(item.nodeid, current_device=current, op=op))
        op_watch.add(tracker)
        found = self.detector_findings.setdefault(item.nodeid, [])
        self.children[item.nodeid] = set(guard.live_children())
        self._spent(item.nodeid, time.perf_counter() - t0)
        self.detectors.start(info, found)
        outcome = yield
        if guard.is_fork_of(self.pid):  # os.fork() in the case, and the child came back here
            os._exit(0)
        times = _repeats(item, found, info)
        if times > 1 and outcome.excinfo is None:
            self.detectors.repeat(item.runtest, times)
        op_watch.remove(tracker)
        named = tracker.raised or tracker.last
        if named is not None:
            self.case_ops[item.nodeid] = named
        if tracker.raised is not None:
            self.raising_ops[item.nodeid] = tracker.raised
        lost = outcome.excinfo is not None and sticky_cuda_error(outcome.excinfo[1]) is not None
        stood_down = self.detectors.finish(
            info, found, self.detector_data.setdefault(item.nodeid, {}), lost_context=lost
        )
        if stood_down:
            self.stood_down[item.nodeid] = stood_down
        del outcome

    def add_attached(self, item: pytest.Item, attached: list[Finding], op: str | None) -> None:
        """Findings the case attached (``gpucheck_findings``, ``check_op``), beside its
        detectors' (one finding of each: :func:`gpucheck.worker.case.merge`)."""
        existing = self.detector_findings.setdefault(item.nodeid, [])
        new = merge(existing, attached, op)
        suite = self.suite_of(self.resolved(item))
        case = self.ids.get(item.nodeid, item.nodeid)
        for f in new:
            f.device, f.suite, f.case = self.device, suite, case
        existing.extend(new)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        if guard.is_fork_of(self.pid):  # a fork of this worker writes no record
            os._exit(0)
        reports = self.reports.pop(nodeid, [])
        t0, started_at, _ = self.started.pop(nodeid, (time.monotonic(), clock.now(), 0.0))
        t1 = time.perf_counter()
        self._process_findings(nodeid)
        self._spent(nodeid, time.perf_counter() - t1)
        record = self.build(nodeid, reports, time.monotonic() - t0, started_at)
        self._append(record)
        self.done += 1
        self.findings += len(record.findings)
        self._state(None)
        if _lost_context(reports):
            # Every later case in this process would fail with the same error: stop here and
            # let the harness continue in a fresh process.
            sys.stderr.write(f"gpucheck: CUDA context lost in {nodeid}; worker exits\n")
            sys.stderr.flush()
            self._state(None, exit_reason=worker_state.CONTEXT_LOST)
            os._exit(contract.EXIT_CONTEXT_LOST)

    def _spent(self, nodeid: str, seconds: float) -> None:
        """Seconds of the worker's own bookkeeping on a case (``cost_s["record"]``)."""
        self.bookkeeping[nodeid] = self.bookkeeping.get(nodeid, 0.0) + seconds

    def _process_findings(self, nodeid: str) -> None:
        """Warnings for what the case did to the worker process: a working folder or a CUDA
        variable it changed (put back here, so later cases are not affected), processes its
        body started and left running."""
        found = []
        before = self.process_state.pop(nodeid, None)
        changes = guard.changed_state(before) if before is not None else []
        if changes:
            found.append(
                Finding(
                    kind="process-state",
                    severity="warning",
                    message=f"the case changed {'; '.join(changes)} and did not put it back",
                    hint="gpucheck put it back before the next case; use monkeypatch.chdir / "
                    "monkeypatch.setenv, which undo themselves",
                )
            )
        earlier = self.children.pop(nodeid, None)
        stray = {
            p: c
            for p, c in guard.live_children().items()
            if earlier is not None and p not in earlier
        }
        if stray:
            found.append(
                Finding(
                    kind="stray-process",
                    severity="warning",
                    message=f"the case left {len(stray)} process(es) running: "
                    + "; ".join(f"pid {p}: {c}" for p, c in sorted(stray.items())),
                    hint="wait for (or end) the processes a test starts; gpucheck ends them with "
                    "the worker",
                )
            )
        if found:
            suite, case = self.suite_of(self._path_of(nodeid)), self.ids.get(nodeid, nodeid)
            for f in found:
                f.device, f.suite, f.case = self.device, suite, case
            self.detector_findings.setdefault(nodeid, []).extend(found)

    def build(
        self, nodeid: str, reports: list[pytest.TestReport], duration: float, started_at: str
    ) -> CaseRecord:
        suite = self.suite_of(self._path_of(nodeid))
        case = self.ids.get(nodeid, nodeid)
        status, reason = "passed", None
        findings: list[Finding] = []
        call_failure: Finding | None = None
        current = None
        for i, rep in enumerate(reports):
            for key, value in rep.user_properties:
                if key == contract.CURRENT_DEVICE_PROPERTY:
                    current = None if value is None else str(value)
            if rep.skipped:
                if hasattr(rep, "wasxfail"):
                    status, reason = "skipped", f"expected failure: {rep.wasxfail}"
                elif status == "passed":
                    status, reason = "skipped", _skip_reason(rep)
            elif rep.failed:
                if rep.when == "teardown" and _lost_context(reports[:i]):
                    continue  # the teardown only met the context the case already lost
                status = "failed" if rep.when == "call" else "error"
                findings.append(
                    _failure_finding(
                        rep,
                        self.device,
                        suite,
                        case,
                        other_current=current not in (None, self.device),
                    )
                )
                if rep.when == "call":
                    call_failure = findings[-1]
                    if call_failure.kind == "cuda-error":  # raised in or after that op
                        call_failure.op = self.case_ops.get(nodeid)
                    else:  # an extension's own error ("invalid argument"): the op it came from
                        call_failure.op = self.raising_ops.get(nodeid)
                reason = reason or findings[-1].message
        attached = self.detector_findings.pop(nodeid, [])
        if call_failure is not None and _said_by(call_failure, attached):
            findings.remove(call_failure)
        mixed = next((f for f in attached if f.kind == results.MIXED_DEVICES), None)
        if call_failure is not None and call_failure.kind == "cuda-error" and mixed:
            call_failure.hint = results.mixed_devices_hint(mixed)  # not a device guard
        stood_down = self.stood_down.pop(nodeid, None)
        if stood_down and call_failure is not None:  # one note, on the error that caused it
            call_failure.evidence = f"{stood_down_note(stood_down)}\n{call_failure.evidence or ''}"
        findings.extend(attached)
        data = self.detector_data.pop(nodeid, {})
        self.case_ops.pop(nodeid, None)
        self.raising_ops.pop(nodeid, None)
        fingerprints = list(data.get("fingerprints", []))
        if self.san_glob is not None:
            found = self._sanitizer_findings(case, suite, current not in (None, self.device))
            findings.extend(found)
            if any(f.severity == "error" for f in found) and status in ("passed", "skipped"):
                status, reason = "failed", f"compute-sanitizer: {found[0].message}"
        memory: dict[str, Any] = {
            "torch_peak_allocated": None,
            "torch_peak_reserved": None,
            "nvml_peak_used": None,
        }
        if self.peaks is not None and self.sampler is not None:
            self.peaks(time.time(), self.sampler.sample())  # catch cases shorter than a period
            peaks = self.peaks.snapshot()
            failed = self.peaks.error()
            if failed:  # a peak NVML did not see is unknown, not 0
                findings.append(_nvml_failed(failed, self.device, suite, case))
            else:
                memory["nvml_peak_used"] = peaks.get(self.uuid or "", 0)
                memory["nvml_peak_other_devices"] = {
                    u: b for u, b in peaks.items() if u != self.uuid and b
                }
        cuda = _torch_cuda()
        if cuda is not None and self.device_index is not None:
            memory["torch_peak_allocated"] = int(cuda.max_memory_allocated(self.device_index))
            memory["torch_peak_reserved"] = int(cuda.max_memory_reserved(self.device_index))
            memory["torch_allocated_at_start"] = self.allocated_at_start.pop(nodeid, None)
        return CaseRecord(
            run_id=self.run_id,
            device=self.device,
            device_uuid=self.uuid,
            suite=suite,
            case=case,
            mode=self.mode,
            status=status,
            reason=reason,
            duration_s=round(duration, 6),
            started_at=started_at,
            current_device=current,
            memory=memory,
            findings=[f for f in findings if f is not None],
            fingerprints=fingerprints,
            numerics=list(data.get("numerics", [])),
            cost_s=_rounded(
                _with_bookkeeping(data.get("cost_s", {}), self.bookkeeping.pop(nodeid, 0.0))
            ),
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


def _with_bookkeeping(costs: dict[str, float], seconds: float) -> dict[str, float]:
    """``costs`` with the worker's bookkeeping added under ``record`` (its op tracker's
    seconds around the calls are there already)."""
    return {**costs, BOOKKEEPING: costs.get(BOOKKEEPING, 0.0) + seconds}


def _rounded(costs: dict[str, float]) -> dict[str, float]:
    return {name: round(seconds, 6) for name, seconds in costs.items()}


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


def _said_by(failure: Finding, others: list[Finding]) -> bool:
    """Whether a detector's or an attached finding already says what the test's failure says
    (a ``check_op`` case attaches its finding, then raises with the same text): it then
    stands for the failure, and takes the failure's evidence and hint where it has none. A
    CUDA error stays a ``cuda-error`` finding unless the other one is of that kind too."""
    text = failure.message.split(": ", 1)[-1]  # without the exception's type
    for other in others:
        if (
            failure.kind in ("test-failure", other.kind)
            and len(text) >= 12
            and text in other.message
        ):
            other.evidence = other.evidence or failure.evidence
            other.hint = other.hint or failure.hint
            return True
    return False


def _lost_context(reports: list[pytest.TestReport]) -> bool:
    """Whether a phase of the case failed with a CUDA error that lost the process's context
    (however the test wrapped it: ``check_dtypes`` quotes it in an AssertionError)."""
    return any(
        rep.failed and sticky_cuda_error_line(str(rep.longrepr)) is not None for rep in reports
    )


def _skip_reason(rep: pytest.TestReport) -> str:
    longrepr = rep.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _nvml_failed(why: str, device: str, suite: str, case: str) -> Finding:
    """The warning of a case during which NVML failed (mode nvml): its peaks are unknown."""
    return Finding(
        kind="nvml-error",
        severity="warning",
        message=f"NVML failed while this case ran ({why}): its NVML memory peak is unknown, and "
        "memory it held on other GPUs (a stray context) could not be seen",
        device=device,
        suite=suite,
        case=case,
        hint="the case's own result stands; NVML answered before and then failed (a driver "
        "problem: nvidia-smi and the kernel log say more); the run's notes say since when",
    )


def _failure_finding(
    rep: pytest.TestReport, device: str, suite: str, case: str, other_current: bool = False
) -> Finding:
    """The finding of a failed phase: ``cuda-error`` or ``test-failure``. The CUDA error's
    hint names a missing device guard only when another device was current (``other_current``):
    with the case's own device current a guard changes nothing."""
    text = str(rep.longrepr)
    crash = getattr(rep.longrepr, "reprcrash", None)
    message = (
        crash.message.strip().splitlines()[0]
        if crash and crash.message
        else (text.strip().splitlines()[-1] if text.strip() else f"{rep.when} failed")
    )
    cuda_error = any(m in text for m in CUDA_ERROR_MARKERS)
    where = "" if rep.when == "call" else f" (in {rep.when})"
    return Finding(
        kind="cuda-error" if cuda_error else "test-failure",
        severity="error",
        message=message + where,
        device=device,
        suite=suite,
        case=case,
        evidence=text[-EVIDENCE_CHARS:],
        hint=(
            (
                "a CUDA error: under CUDA_LAUNCH_BLOCKING=1 it is raised at the launch that "
                "failed; "
                + (
                    "with another device current, an illegal memory access is the "
                    "classic missing device guard (OptionalCUDAGuard(device_of("
                    "input))): the wrong-device check re-runs the case with its own "
                    "device current to tell"
                    if other_current
                    else "its own device was current, so it is not a device guard: look "
                    "at the kernel's indexing and its arguments' devices and sizes"
                )
            )
            if cuda_error
            else None
        ),
    )
