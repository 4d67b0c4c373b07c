"""A case's outcome from pytest's reports of its phases, and its findings reconciled.

:func:`outcome` reads the reports (setup, call, teardown) into a status, its reason and the
finding of each failed phase (``test-failure`` or ``cuda-error``); :func:`reconcile` puts the
case's own findings (its detectors', those it attached) beside them: a failure that one of
them already says is left out, a CUDA error after a call with mixed devices gets that call's
hint, the note of detectors that stood down goes on the error that made them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpucheck.errors import CUDA_ERROR_MARKERS, sticky_cuda_error_line
from gpucheck.model import contract, results
from gpucheck.model.results import EVIDENCE_CHARS, CaseInfo, Finding, Status
from gpucheck.worker.detector_loop import stood_down_note


@dataclass
class Outcome:
    """What pytest's reports say of a case."""

    status: Status = "passed"
    reason: str | None = None
    #: the finding of each failed phase
    findings: list[Finding] = field(default_factory=list)
    #: the call phase's failure, if it failed
    call_failure: Finding | None = None
    #: the device the case made current (``gpu_device``'s property), None: none said
    current: str | None = None

    def other_current(self, device: str) -> bool:
        """Whether another device than the case's own was current while it ran."""
        return self.current not in (None, device)

    def fail(self, found: list[Finding], why: str) -> None:
        """A case that passed (or was skipped) fails when ``found`` holds an error (a
        compute-sanitizer record of its calls): ``why`` and the first finding's message are
        its reason."""
        if any(f.severity == "error" for f in found) and self.status in ("passed", "skipped"):
            self.status, self.reason = "failed", f"{why}: {found[0].message}"


def outcome(
    reports: list[pytest.TestReport], info: CaseInfo, op: str | None, raising_op: str | None
) -> Outcome:
    """The case's outcome from its reports. A failed call names the op it came from: a CUDA
    error the last op called (``op``: raised in or after it), an extension's own error the op
    that raised it (``raising_op``)."""
    out = Outcome()
    for i, rep in enumerate(reports):
        for key, value in rep.user_properties:
            if key == contract.CURRENT_DEVICE_PROPERTY:
                out.current = None if value is None else str(value)
        if rep.skipped:
            if hasattr(rep, "wasxfail"):
                out.status, out.reason = "skipped", f"expected failure: {rep.wasxfail}"
            elif out.status == "passed":
                out.status, out.reason = "skipped", _skip_reason(rep)
        elif rep.failed:
            if rep.when == "teardown" and lost_context(reports[:i]):
                continue  # the teardown only met the context the case already lost
            out.status = "failed" if rep.when == "call" else "error"
            failure = failure_finding(rep, info, other_current=out.other_current(info.device))
            out.findings.append(failure)
            if rep.when == "call":
                out.call_failure = failure
                failure.op = op if failure.kind == "cuda-error" else raising_op
            out.reason = out.reason or failure.message
    return out


def reconcile(out: Outcome, attached: list[Finding], stood_down: list[str]) -> list[Finding]:
    """The case's findings: its failures', then its own (``attached``: its detectors' and
    those it attached). A call failure that one of its own already says is left out (that one
    takes its evidence and hint); a CUDA error after a call with mixed devices gets that
    call's hint, not a device guard's; the note of the detectors that ``stood_down`` goes on
    the call's failure."""
    findings = list(out.findings)
    failure = out.call_failure
    if failure is not None and _said_by(failure, attached):
        findings.remove(failure)
    mixed = next((f for f in attached if f.kind == results.MIXED_DEVICES), None)
    if failure is not None and failure.kind == "cuda-error" and mixed:
        failure.hint = results.mixed_devices_hint(mixed)  # not a device guard
    if stood_down and failure is not None:  # one note, on the error that caused it
        failure.evidence = f"{stood_down_note(stood_down)}\n{failure.evidence or ''}"
    return [*findings, *attached]


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


def lost_context(reports: list[pytest.TestReport]) -> bool:
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


def failure_finding(rep: pytest.TestReport, info: CaseInfo, other_current: bool = False) -> Finding:
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
    return info.finding(
        "cuda-error" if cuda_error else "test-failure",
        "error",
        message + where,
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
