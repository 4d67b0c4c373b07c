"""What a case leaves besides its outcome: the findings it attaches (``gpucheck_findings``,
``check_op``), a CUDA context it loses, and, outside ``gpucheck run``, what the detectors
find in it (plain pytest: the terminal summary, JUnit properties, the exit status).

The process-wide state of the case under way lives in one object, :data:`STATE`.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpucheck.detectors import ext_watch
from gpucheck.detectors.base import CaseInfo
from gpucheck.detectors.registry import worker_detectors
from gpucheck.errors import sticky_cuda_error_line
from gpucheck.model.contract import CONTEXT_LOST_PROPERTY, FINDING_PROPERTY, RECORDER
from gpucheck.model.results import CaseData, Finding, Severity
from gpucheck.worker.detector_loop import DetectorLoop
from gpucheck.worker.targets import xdist_worker


@dataclass
class State:
    """The findings of the case under way and, outside ``gpucheck run``, of the session."""

    #: findings attached by the case under way: drained into its record after its teardown
    attached: list[Finding] = field(default_factory=list)
    #: the op the case under way checks (check_op): named on its findings that name none
    case_op: str | None = None
    #: findings of finished cases, outside ``gpucheck run`` (terminal summary, exit status)
    reported: list[dict[str, Any]] = field(default_factory=list)
    #: findings of the detectors outside ``gpucheck run``, by node id
    plain_findings: dict[str, list[Finding]] = field(default_factory=dict)
    #: outside ``gpucheck run``: (case, first line of the error) that lost this process's
    #: CUDA context; the later tests that use CUDA fail in setup, "not run", instead of each
    #: failing with the same error (and blaming whatever op it checks)
    context_lost: list[tuple[str, str]] = field(default_factory=list)
    #: the not-run tests, by the case that lost the context (the controller's count under
    #: xdist)
    not_run: dict[str, int] = field(default_factory=dict)
    plain_detectors: DetectorLoop | None = None


STATE = State()


def reset() -> None:
    """A fresh state for a new session (pytester runs several in one process)."""
    global STATE
    STATE = State()


# --- findings a case attaches -------------------------------------------------------------
def attach(
    kind: str,
    message: str,
    *,
    severity: Severity = "error",
    op: str | None = None,
    kernel: str | None = None,
    evidence: str | None = None,
    hint: str | None = None,
) -> Finding:
    """Attach a finding to the case under way (device, suite and case are filled in when it
    ends). Returns the :class:`~gpucheck.model.results.Finding`."""
    if severity not in ("error", "warning", "info"):
        raise ValueError(f"severity must be error, warning or info, got {severity!r}")
    if not kind or not message:
        raise ValueError("a finding needs a kind and a message")
    f = Finding(
        kind=kind,
        severity=severity,
        message=message,
        op=op,
        kernel=kernel,
        evidence=evidence,
        hint=hint,
    )
    STATE.attached.append(f)
    return f


def set_case_op(name: str | None) -> None:
    """Name the op the case under way checks: its findings that name no op get this one."""
    STATE.case_op = name


def merge(existing: list[Finding], attached: list[Finding], op: str | None) -> list[Finding]:
    """The attached findings to add to a case that already has ``existing`` (its detectors'):
    ``op`` is named on every finding that names none; an attached finding the detectors
    already made (same kind, op and message, or any device-state leak once one is there) is
    left out."""
    for f in (*existing, *attached):
        if f.op is None and op is not None:
            f.op = op
    keep = []
    for f in attached:
        if any(
            e.kind == f.kind
            and e.op == f.op
            and (e.message == f.message or f.kind == "device-state-leak")
            for e in existing
        ):
            continue
        keep.append(f)
    return keep


class Findings:
    """The ``gpucheck_findings`` fixture: attach findings to this test's case record."""

    def __init__(self) -> None:
        self.attached: list[Finding] = []

    def attach(
        self,
        kind: str,
        message: str,
        *,
        severity: Severity = "error",
        op: str | None = None,
        kernel: str | None = None,
        evidence: str | None = None,
        hint: str | None = None,
    ) -> Finding:
        """A finding (``kind`` e.g. ``"numerics"``, ``severity`` error / warning / info)."""
        f = attach(
            kind, message, severity=severity, op=op, kernel=kernel, evidence=evidence, hint=hint
        )
        self.attached.append(f)
        return f

    __call__ = attach


# --- a lost CUDA context ------------------------------------------------------------------
def uses_cuda(item: pytest.Item) -> bool:
    return "gpu_device" in getattr(item, "fixturenames", ()) or any(
        item.get_closest_marker(name) is not None for name in ("gpu", "multigpu")
    )


def sticky_cuda_error(err: BaseException) -> str | None:
    """The first line of a CUDA error that leaves the process's context unusable, in ``err``
    or the exceptions it was raised from, or None."""
    messages: list[str] = []
    e: BaseException | None = err
    while e is not None and len(messages) < 32:  # a chain can loop
        messages.append(str(e))
        e = e.__cause__ or e.__context__
    return sticky_cuda_error_line("\n".join(messages))


def recorder(config: pytest.Config) -> Any:
    """The recorder of ``gpucheck run`` (None under plain pytest)."""
    return config.pluginmanager.get_plugin(RECORDER)


# --- hooks (called by gpucheck.pytest_plugin) ---------------------------------------------
def setup(item: pytest.Item, unwatched: list[str]) -> None:
    """Before a test: a clean slate, the extension watch for it, and "not run" after a lost
    context."""
    STATE.attached.clear()
    STATE.case_op = None
    ext_watch.begin_test(unwatched)  # and wraps extensions imported before the watch
    if STATE.context_lost and uses_cuda(item):
        case, error = STATE.context_lost[0]
        item.user_properties.append((CONTEXT_LOST_PROPERTY, case))
        pytest.fail(
            f"not run: this process's CUDA context was lost in {case} ({error}); "
            "every later CUDA call in the process fails the same way (gpucheck run "
            "goes on in a fresh process)",
            pytrace=False,
        )


def made_report(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    if call.excinfo is None or STATE.context_lost or recorder(item.config) is not None:
        return  # under gpucheck run the recorder ends the worker and the controller goes on
    error = sticky_cuda_error(call.excinfo.value)
    if error is not None:
        STATE.context_lost.append((item.nodeid, error))


def watch_plain(item: pytest.Item) -> Generator[None, Any, None]:
    """Outside ``gpucheck run``: the worker-side detectors watch the body of every test that
    uses ``gpu_device`` (under ``gpucheck run`` the recorder runs them). A generator for the
    plugin's hookwrapper: yield where the body runs."""
    device = getattr(item, "funcargs", {}).get("gpu_device")
    if recorder(item.config) is not None or device is None:
        yield
        return
    if STATE.plain_detectors is None:
        STATE.plain_detectors = DetectorLoop(worker_detectors())
    loop = STATE.plain_detectors
    info = CaseInfo(str(device), Path(item.path).parent.name, item.nodeid)
    found = STATE.plain_findings.setdefault(item.nodeid, [])
    loop.start(info, found)
    outcome = yield
    raised = outcome.excinfo
    lost = raised is not None and sticky_cuda_error(raised[1]) is not None
    loop.finish(info, found, CaseData(), lost_context=lost)


def drain(item: pytest.Item) -> None:
    """Hand the case's attached findings to its record (``gpucheck run``) or to the
    test's report (plain pytest: ``user_properties``, summed up at the end)."""
    attached, op = list(STATE.attached), STATE.case_op
    STATE.attached.clear()
    STATE.case_op = None
    rec = recorder(item.config)
    if rec is not None:
        rec.add_attached(item, attached, op)
        return
    existing = STATE.plain_findings.pop(item.nodeid, [])
    device = getattr(item, "funcargs", {}).get("gpu_device")
    for f in [*existing, *merge(existing, attached, op)]:
        f.device = f.device or (None if device is None else str(device))
        f.suite, f.case = f.suite or Path(item.path).parent.name, item.nodeid
        item.user_properties.append(
            (FINDING_PROPERTY, json.dumps({k: v for k, v in f.__dict__.items() if v is not None}))
        )


def logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if key == FINDING_PROPERTY:
            STATE.reported.append(json.loads(value) if isinstance(value, str) else dict(value))  # type: ignore[call-overload]
        elif key == CONTEXT_LOST_PROPERTY and report.when == "setup":
            STATE.not_run[str(value)] = STATE.not_run.get(str(value), 0) + 1


def terminal_summary(tr: Any) -> None:
    if STATE.not_run:
        tr.section("gpucheck: CUDA context lost")
    for case, n in STATE.not_run.items():
        tr.line(
            f"{case} lost its process's CUDA context: {n} later test(s) of that process "
            "were not run (errors in setup). `gpucheck run` runs them in a fresh process."
        )
    if not STATE.reported:
        return
    tr.section("gpucheck findings")
    for f in STATE.reported:
        where = " ".join(x for x in (f.get("device"), f.get("op") and f"op {f['op']}") if x)
        tr.line(
            f"{f.get('severity', 'error').upper()} {f.get('kind')} [{where}] "
            f"{f.get('case')}: {f.get('message')}"
        )
        if f.get("hint"):
            tr.line(f"    hint: {f['hint']}")


def session_finish(session: pytest.Session) -> None:
    """Outside ``gpucheck run``, findings of severity error fail the session (exit 1) even
    when every test passed (a kernel on the wrong GPU that peer access let read right)."""
    if xdist_worker(session.config) is not None:
        return  # the controller sums up what its workers reported
    if session.exitstatus == 0 and any(f.get("severity") == "error" for f in STATE.reported):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
