"""Worker side of the harness: pytest hooks that write one results.jsonl record per case.

Active only when pytest gets ``--gpucheck-results FILE`` (the harness passes it). The worker
also keeps a small state file (current case, its start time, progress) that the parent reads
to attribute a crash or a hang to the case that was running, and the findings a detector made
before a call that may crash (``pending_findings``: mixed-device arguments).
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from gpucheck import nvml
from gpucheck.detectors import CaseInfo, mixed_devices, op_watch, worker_detectors
from gpucheck.detectors import leak as leak_mod
from gpucheck.errors import CUDA_ERROR_MARKERS, sticky_cuda_error_line
from gpucheck.report import results
from gpucheck.report.results import CaseRecord, Finding
from gpucheck.runner.nvml_sampler import CasePeaks, Sampler

EVIDENCE_CHARS = 4000
#: the blank tool line that ends a compute-sanitizer record
RECORD_END = re.compile(rb"^={9} ?\n", re.M)
#: exit code of a worker that stopped because its CUDA context is lost (the harness replaces it)
EXIT_CONTEXT_LOST = 75


def add_options(group: Any) -> None:
    group.addoption("--gpucheck-results", default=None, help="append case records here")
    group.addoption("--gpucheck-state", default=None, help="worker state file (harness)")
    group.addoption("--gpucheck-run-id", default="adhoc")
    group.addoption("--gpucheck-mode", default="plain")
    group.addoption("--gpucheck-device-uuid", default=None)
    group.addoption("--gpucheck-suite", action="append", default=[], metavar="NAME=PATH",
                    help="name of the suite rooted at PATH (for records)")
    group.addoption("--gpucheck-nvml-interval", type=float, default=0.0, metavar="SECONDS",
                    help="sample this process's GPU memory with NVML (0: off)")
    group.addoption("--gpucheck-sanitizer-log", default=None, metavar="TEMPLATE",
                    help="compute-sanitizer --log-file of this run (%%p = pid)")
    group.addoption("--gpucheck-sanitizer-tool", default=None)
    group.addoption("--gpucheck-skip", default=None, metavar="FILE",
                    help="deselect the node ids listed in FILE (already recorded cases)")
    group.addoption("--gpucheck-only", default=None, metavar="FILE",
                    help="run only the case ids listed in FILE (the wrong-device re-run)")


def stacks_path(state_path: Path) -> Path:
    """Where a worker's thread stacks go when the parent asks for them (hangs)."""
    return state_path.with_name(state_path.name.replace(".state.json", "") + ".stacks.txt")


def write_state(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def read_state(path: Path) -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return loaded


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _torch_cuda() -> Any:
    """torch.cuda if this process already initialized CUDA, else None (never initializes it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda


class Recorder:
    """Collects setup/call/teardown reports of each item into one record."""

    def __init__(self, config: pytest.Config) -> None:
        self.results = Path(config.getoption("--gpucheck-results"))
        state = config.getoption("--gpucheck-state")
        self.state_path = Path(state) if state else None
        self.run_id = config.getoption("--gpucheck-run-id")
        self.mode = config.getoption("--gpucheck-mode")
        self.uuid = config.getoption("--gpucheck-device-uuid")
        devices = config.getoption("--gpucheck-device") or []
        self.device = os.environ.get("GPUCHECK_DEVICE_LABEL") or (
            f"cuda:{devices[0]}" if devices else "cpu")  # distributed runs: "rank1/cuda:1"
        self.device_index: int | None = devices[0] if devices else None
        self.suites = []
        for spec in config.getoption("--gpucheck-suite"):
            name, _, path = spec.partition("=")
            self.suites.append((name, Path(path).resolve()))
        self.rootpath = Path(config.rootpath)
        self.paths: dict[str, Path] = {}  # node id -> test file
        self.ids: dict[str, str] = {}  # node id -> case id (relative to the suite root)
        self.reports: dict[str, list[pytest.TestReport]] = {}
        self.started: dict[str, tuple[float, str, float]] = {}  # monotonic, iso, epoch
        self.allocated_at_start: dict[str, int] = {}  # PyTorch allocated on the target
        self.detectors = worker_detectors()
        self.pending: list[dict[str, Any]] = []  # findings made before a call that may crash
        self.last_state: dict[str, Any] = {}
        for d in self.detectors:
            if isinstance(d, leak_mod.Leak):
                d.device_index, d.uuid = self.device_index, self.uuid
            if isinstance(d, mixed_devices.MixedDevices):
                d.persist = self._persist
        self.detector_findings: dict[str, list[Finding]] = {}
        self.detector_data: dict[str, dict[str, Any]] = {}  # node id -> fields of its record
        self.case_ops: dict[str, str] = {}  # node id -> the last extension op it called
        self.done = 0
        self.total = 0
        self.findings = 0
        template = config.getoption("--gpucheck-sanitizer-log")
        # compute-sanitizer names logs after a pid of its own choosing (not always ours), and
        # a case's child processes get their own: follow every log of this worker.
        self.san_glob = Path(template.replace("%p", "*")) if template else None
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
            self._stacks = open(stacks_path(self.state_path), "w")  # noqa: SIM115
            faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)

    def _persist(self, findings: list[Finding]) -> None:
        """A detector's findings of the case under way, into the state file now."""
        self.pending = [dict(f.__dict__) for f in findings]
        self._state(**self.last_state)

    def _state(self, case: str | None, exit_reason: str | None = None,
               current_device: str | None = None, op: str | None = None) -> None:
        self.last_state = {"case": case, "exit_reason": exit_reason,
                           "current_device": current_device, "op": op}
        if case is None:
            self.pending = []
        if self.state_path is None:
            return
        write_state(self.state_path, {
            "case": self.ids.get(case, case) if case else None,
            "suite": self.suite_of(self._path_of(case)) if case else None,
            "current_device": current_device, "op": op,
            "started": self.started[case][2] if case in self.started else time.time(),
            "done": self.done, "total": self.total,
            "findings": self.findings, "pid": os.getpid(), "exit_reason": exit_reason,
            "sanitizer_offsets": self.san_offsets, "pending_findings": self.pending,
        })

    def _path_of(self, nodeid: str) -> Path:
        if nodeid in self.paths:
            return self.paths[nodeid]
        return (self.rootpath / nodeid.split("::")[0]).resolve()

    def case_id(self, item: pytest.Item) -> str:
        """The item's id relative to its suite's root (``test_knn.py::test_x[cuda0]``): the
        same wherever pytest put its rootdir, so records, resumes and restarts agree."""
        path = Path(item.path).resolve()
        _, _, rest = item.nodeid.partition("::")
        for _, root in self.suites:
            base = root if root.is_dir() else root.parent
            if path == base or base in path.parents:
                rel = path.relative_to(base).as_posix()
                return f"{rel}::{rest}" if rest else rel
        return item.nodeid

    def _sanitizer_findings(self, case: str, suite: str) -> list[Finding]:
        """Records compute-sanitizer wrote to this process's log while the case ran."""
        cuda = _torch_cuda()
        if cuda is not None:
            cuda.synchronize()
        assert self.san_glob is not None
        found: list[Finding] = []
        for log in sorted(self.san_glob.parent.glob(self.san_glob.name)):
            text, end = read_records(log, self.san_offsets.get(str(log), 0))
            self.san_offsets[str(log)] = end
            if text:
                found += sanitizer_findings(text, self.san_tool, self.device, suite, case)
        return found

    def suite_of(self, item_path: Path) -> str:
        for name, root in self.suites:
            if item_path == root or root in item_path.parents:
                return name
        return item_path.parent.name

    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        self.ids.update({i.nodeid: self.case_id(i) for i in items})
        only_file = config.getoption("--gpucheck-only")
        if only_file:
            only = set(Path(only_file).read_text().split("\n"))
            config.hook.pytest_deselected(items=[i for i in items
                                                 if self.ids[i.nodeid] not in only])
            items[:] = [i for i in items if self.ids[i.nodeid] in only]
        skip_file = config.getoption("--gpucheck-skip")
        if not skip_file:
            return
        skip = set(Path(skip_file).read_text().split("\n"))
        keep = [i for i in items if self.ids[i.nodeid] not in skip]
        config.hook.pytest_deselected(items=[i for i in items
                                             if self.ids[i.nodeid] in skip])
        items[:] = keep

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = len(session.items)
        self.paths = {item.nodeid: Path(item.path).resolve() for item in session.items}
        self._state(None)

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.started[nodeid] = (time.monotonic(), now_iso(), time.time())
        cuda = _torch_cuda()
        if cuda is not None and self.device_index is not None:
            cuda.reset_peak_memory_stats(self.device_index)  # the target's, whatever is current
            # what earlier cases left allocated: the case's own peak is the peak above it
            self.allocated_at_start[nodeid] = int(cuda.memory_allocated(self.device_index))
        if self.peaks is not None and self.sampler is not None:
            self.peaks.reset()
            self.peaks(time.time(), self.sampler.sample())
        self._state(nodeid)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        """The detectors watch the body of the case (fixtures have set the stage by then)."""
        info = CaseInfo(self.device, self.suite_of(Path(item.path).resolve()),
                        self.ids.get(item.nodeid, item.nodeid))
        current = dict(item.user_properties).get("gpucheck_current_device")
        current = None if current is None else str(current)
        self._state(item.nodeid, current_device=current)
        tracker = _OpTracker(lambda op: self._state(item.nodeid, current_device=current, op=op))
        op_watch.add(tracker)
        found = self.detector_findings.setdefault(item.nodeid, [])
        started = []
        for d in self.detectors:
            try:
                d.case_started(info)
                started.append(d)
            except Exception as err:  # a detector must never take a case down with it
                found.append(_detector_error(d.name, err, self.device, info))
        outcome = yield
        times = _repeats(item, found, self.device, info)
        if times > 1 and outcome.excinfo is None:
            for d in started:
                if isinstance(d, leak_mod.Leak):
                    d.repeat(item.runtest, times)
        op_watch.remove(tracker)
        if tracker.last is not None:
            self.case_ops[item.nodeid] = tracker.last
        data = self.detector_data.setdefault(item.nodeid, {})
        for d in started:
            try:
                found.extend(d.case_finished(info))
                data.update(d.case_data())
            except Exception as err:
                found.append(_detector_error(d.name, err, self.device, info))
        del outcome

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        reports = self.reports.pop(nodeid, [])
        t0, started_at, _ = self.started.pop(nodeid, (time.monotonic(), now_iso(), 0.0))
        record = self.build(nodeid, reports, time.monotonic() - t0, started_at)
        results.append(self.results, record.to_json())
        self.done += 1
        self.findings += len(record.findings)
        self._state(None)
        if _lost_context(reports):
            # Every later case in this process would fail with the same error: stop here and
            # let the harness continue in a fresh process.
            sys.stderr.write(f"gpucheck: CUDA context lost in {nodeid}; worker exits\n")
            sys.stderr.flush()
            self._state(None, exit_reason="context-lost")
            os._exit(EXIT_CONTEXT_LOST)

    def build(self, nodeid: str, reports: list[pytest.TestReport], duration: float,
              started_at: str) -> CaseRecord:
        suite = self.suite_of(self._path_of(nodeid))
        case = self.ids.get(nodeid, nodeid)
        status, reason = "passed", None
        findings: list[Finding] = []
        call_failure: Finding | None = None
        current = None
        for i, rep in enumerate(reports):
            for key, value in rep.user_properties:
                if key == "gpucheck_current_device":
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
                findings.append(_failure_finding(rep, self.device, suite, case))
                if rep.when == "call":
                    call_failure = findings[-1]
                    if call_failure.kind == "cuda-error":  # raised in or after that op
                        call_failure.op = self.case_ops.get(nodeid)
                reason = reason or findings[-1].message
        attached = self.detector_findings.pop(nodeid, [])
        if call_failure is not None and _said_by(call_failure, attached):
            findings.remove(call_failure)
        mixed = next((f for f in attached if f.kind == mixed_devices.MixedDevices.name), None)
        if call_failure is not None and call_failure.kind == "cuda-error" and mixed:
            call_failure.hint = mixed_devices.cuda_error_hint(mixed)  # not a device guard
        findings.extend(attached)
        data = self.detector_data.pop(nodeid, {})
        self.case_ops.pop(nodeid, None)
        fingerprints = list(data.get("fingerprints", []))
        if self.san_glob is not None:
            found = self._sanitizer_findings(case, suite)
            findings.extend(found)
            if any(f.severity == "error" for f in found) and status in ("passed", "skipped"):
                status, reason = "failed", f"compute-sanitizer: {found[0].message}"
        memory: dict[str, Any] = {"torch_peak_allocated": None, "torch_peak_reserved": None,
                                  "nvml_peak_used": None}
        if self.peaks is not None and self.sampler is not None:
            self.peaks(time.time(), self.sampler.sample())  # catch cases shorter than a period
            peaks = self.peaks.snapshot()
            memory["nvml_peak_used"] = peaks.get(self.uuid or "", 0)
            memory["nvml_peak_other_devices"] = {u: b for u, b in peaks.items()
                                                 if u != self.uuid and b}
        cuda = _torch_cuda()
        if cuda is not None and self.device_index is not None:
            memory["torch_peak_allocated"] = int(cuda.max_memory_allocated(self.device_index))
            memory["torch_peak_reserved"] = int(cuda.max_memory_reserved(self.device_index))
            memory["torch_allocated_at_start"] = self.allocated_at_start.pop(nodeid, None)
        return CaseRecord(
            run_id=self.run_id, device=self.device, device_uuid=self.uuid, suite=suite,
            case=case, mode=self.mode, status=status, reason=reason,
            duration_s=round(duration, 6), started_at=started_at, current_device=current,
            memory=memory, findings=[f for f in findings if f is not None],
            fingerprints=fingerprints, numerics=list(data.get("numerics", [])),
        )


class _OpTracker:
    """Keeps the extension op being called in the state file, so that a crash or a hang
    inside it names the op (written when the op changes, not on every call)."""

    def __init__(self, write: Any) -> None:
        self.write = write
        self.last: str | None = None

    def before(self, call: op_watch.Call) -> None:
        if call.op != self.last:
            self.last = call.op
            self.write(call.op)

    def after(self, call: op_watch.Call, out: Any) -> None:
        return None


def _repeats(item: pytest.Item, found: list[Finding], device: str, info: CaseInfo) -> int:
    """How often a case runs (``gpucheck_repeat``); a bad marker is a finding, run once."""
    try:
        return leak_mod.repeats(item)
    except ValueError as err:
        found.append(_detector_error("leak", err, device, info))
        return 1


def _detector_error(name: str, err: Exception, device: str, info: CaseInfo) -> Finding:
    return Finding(kind="detector-error", severity="warning",
                   message=f"detector {name} failed: {err!r}", device=device,
                   suite=info.suite, case=info.case)


def read_records(log: Path, offset: int, complete_only: bool = True) -> tuple[str, int]:
    """The records of a sanitizer log after byte ``offset``, and the offset after them.

    With ``complete_only``, a record the tool is still writing (no blank line after it yet)
    is left for the next read.
    """
    with open(log, "rb") as f:
        f.seek(offset)
        data = f.read()
    if not complete_only:
        return data.decode(errors="replace"), offset + len(data)
    ends = list(RECORD_END.finditer(data))
    if not ends:
        return "", offset
    cut = ends[-1].end()
    return data[:cut].decode(errors="replace"), offset + cut


def sanitizer_findings(text: str, tool: str | None, device: str, suite: str | None,
                       case: str | None) -> list[Finding]:
    """compute-sanitizer records (a slice of its log) as findings of one case."""
    from gpucheck.sanitizer import parse

    report = parse(text, tool)
    # One finding per (tool, kernel, kind of error): a missing barrier gives racecheck records
    # for every pair of instructions it leaves unordered (68 for one __syncthreads in SSIM's
    # backward), which are one bug; the evidence keeps the first record and lists the others.
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for f in report.findings:
        what = re.sub(r"\s+(at|in)\s.*", "", f.error) if f.tool == "racecheck" else f.error
        groups.setdefault((f.tool, f.kernel_name, f.api_call, f.severity, what), []).append(f)
    out = []
    for group in groups.values():
        f = group[0]
        where = " ".join(x for x in (f.kernel_name and f"in {f.kernel_name}", f.source,
                                     f.python_frame and f"(from {f.python_frame})") if x)
        total = sum(g.count for g in group)
        count = f" x{total}" if total > 1 else ""
        others = sorted({g.source for g in group[1:] if g.source and g.source != f.source})
        also = (f"\n(and {len(group) - 1} more record(s) of this kind in this kernel"
                f"{', at ' + ', '.join(others[:20]) if others else ''})" if len(group) > 1
                else "")
        out.append(Finding(
            kind="sanitizer", severity=f.severity, message=f"{f.error}{count} {where}".strip(),
            device=device, suite=suite, case=case, op=None, kernel=f.kernel_name,
            # the head: error line, kernel, thread/block and address come first in a record
            evidence=("\n".join(f.lines[:40])[:EVIDENCE_CHARS - len(also)] + also),
            hint=_SANITIZER_HINTS.get(f.tool) if f.kernel_name else (
                f"a CUDA API call failed ({f.api_call}): usually the consequence of an earlier "
                "fault in the same case; read the first record" if f.api_call else None),
        ))
    return out


_SANITIZER_HINTS = {
    "memcheck": "an access outside any allocation: check the kernel's bounds and that it "
                "runs on the device of its inputs (device guard)",
    "racecheck": "threads of a block access the same shared memory without a barrier between",
    "initcheck": "the kernel reads device memory nothing wrote (e.g. torch.empty never filled)",
    "synccheck": "a barrier used wrongly (divergent __syncthreads, bad __syncwarp mask)",
}


def _said_by(failure: Finding, others: list[Finding]) -> bool:
    """Whether a detector's or an attached finding already says what the test's failure says
    (a ``check_op`` case attaches its finding, then raises with the same text): it then
    stands for the failure, and takes the failure's evidence and hint where it has none. A
    CUDA error stays a ``cuda-error`` finding unless the other one is of that kind too."""
    text = failure.message.split(": ", 1)[-1]  # without the exception's type
    for other in others:
        if (failure.kind in ("test-failure", other.kind) and len(text) >= 12 and
                text in other.message):
            other.evidence = other.evidence or failure.evidence
            other.hint = other.hint or failure.hint
            return True
    return False


def _lost_context(reports: list[pytest.TestReport]) -> bool:
    """Whether a phase of the case failed with a CUDA error that lost the process's context
    (however the test wrapped it: ``check_dtypes`` quotes it in an AssertionError)."""
    return any(rep.failed and sticky_cuda_error_line(str(rep.longrepr)) is not None
               for rep in reports)


def _skip_reason(rep: pytest.TestReport) -> str:
    longrepr = rep.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _failure_finding(rep: pytest.TestReport, device: str, suite: str, case: str) -> Finding:
    text = str(rep.longrepr)
    crash = getattr(rep.longrepr, "reprcrash", None)
    message = crash.message.strip().splitlines()[0] if crash and crash.message else (
        text.strip().splitlines()[-1] if text.strip() else f"{rep.when} failed")
    cuda_error = any(m in text for m in CUDA_ERROR_MARKERS)
    where = "" if rep.when == "call" else f" (in {rep.when})"
    return Finding(
        kind="cuda-error" if cuda_error else "test-failure",
        severity="error",
        message=message + where,
        device=device, suite=suite, case=case,
        evidence=text[-EVIDENCE_CHARS:],
        hint=("a CUDA error: under CUDA_LAUNCH_BLOCKING=1 it is raised at the launch that "
              "failed; illegal memory access on a non-zero device is the classic missing "
              "device guard (OptionalCUDAGuard(device_of(input)))") if cuda_error else None,
    )
