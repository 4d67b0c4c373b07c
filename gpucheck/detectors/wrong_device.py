"""wrong-device, by differential re-run: a case that goes wrong only while *another* device is
current is a missing device guard.

Every case runs with another device current and initialized (the state real training leaves
the process in). A case that then fails, errors, crashes or gets compute-sanitizer errors is
run again, in a fresh worker, with its own target current and no other device touched: in
the sanitizer passes that is the ``|target-current`` pass every marked case gets anyway, in
the other passes a re-run of just those cases (``|rerun:target-current``), and a control
re-run with another device current again (``|rerun:other-current``). Passes with the target
current and goes wrong again in the control: the kernel ran on the current device instead of
its inputs' device, a ``wrong-device`` finding with the outcomes as evidence. Fails with the
target current too: the original finding stands, it is not a device bug. Passes both ways: a
``not-reproducible`` warning (a random input or a race made it fail once). The comparison
itself is plain data in, findings out (``diagnose``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpucheck.detectors.base import BaseDetector
from gpucheck.model import modes
from gpucheck.model.kinds import Kind
from gpucheck.model.modes import Mode, try_parse
from gpucheck.model.results import CaseRecord, Finding

BAD = ("failed", "error", "crashed")
HINT = (
    "make the extension run on its inputs' device: "
    "`const at::cuda::OptionalCUDAGuard guard(device_of(x));` as the first line of {where}, "
    "so kernels, thrust/cub calls and allocations go to x's device, not the current one"
)
#: C++ host frames of a sanitizer record: the first one outside the runtime names the function
_HOST_FRAME = re.compile(r"Host Frame: ?(?P<fn>[^\[]+?)(?: \[0x[0-9a-f]+\])? in (?P<lib>\S+)")
_RUNTIME_LIBS = (
    "libcuda",
    "libcudart",
    "libtorch",
    "libc10",
    "libpython",
    "libc.so",
    "python3",
    "ld-linux",
)


def _key(r: CaseRecord) -> tuple[str, str, str]:
    return (r.device, r.suite, r.case)


#: the findings that say how a case *ended* (the outcome the device comparison looks at);
#: every other kind is another question, answered by its own detector from its own evidence
OUTCOME_KINDS = ("crash", "cuda-error", "hang", "sanitizer")


def _went_wrong(r: CaseRecord) -> bool:
    """The case's outcome was bad: it failed, errored or crashed, or compute-sanitizer
    reported an error (memcheck finds an access a lucky run survives)."""
    return r.status in BAD or any(f.kind == "sanitizer" for f in r.errors())


def _clean(r: CaseRecord) -> bool:
    """The outcome alone was good: passed, no CUDA error, crash or sanitizer error. Other
    detectors' findings (a launch on the legacy stream, a leak) are not looked at: they
    answer other questions, and nearly every extension with a missing guard also launches on
    the legacy stream."""
    return r.status == "passed" and not any(f.kind in OUTCOME_KINDS for f in r.errors())


def suspects(records: Iterable[CaseRecord], mode: str) -> list[CaseRecord]:
    """Cases of ``mode`` that went wrong while another device than their target was current."""
    return [
        r
        for r in records
        if r.mode == mode and r.current_device not in (None, r.device) and _went_wrong(r)
    ]


_NOT_ENTRY = (
    "(anonymous namespace)",
    "void ",
    "cudaLaunch",
    "pybind11::",
    "c10::",
    "at::",
    "torch::",
    "std::",
    "__",
)


def extension_function(record: CaseRecord) -> tuple[str | None, str | None]:
    """(function, kernel) named by the record's findings: the extension's entry point from a
    sanitizer record's host frames (the outermost frame of the extension's own library that
    takes a tensor, before pybind11 and the dispatcher), and the kernel it reported."""
    for f in record.findings:
        frames = [
            (m["fn"].strip(), m["lib"])
            for m in _HOST_FRAME.finditer(f.evidence or "")
            if not any(lib in m["lib"] for lib in _RUNTIME_LIBS)
        ]
        own = [fn for fn, _ in frames if not fn.startswith(_NOT_ENTRY)]
        entry = [fn for fn in own if "Tensor" in fn]
        if entry or own:
            return (entry or own)[-1 if entry else 0], f.kernel
    kernel = next((f.kernel for f in record.findings if f.kernel), None)
    # the op the worker saw the case call last (crash, hang and CUDA-error findings keep it)
    op = next((f.op for f in record.findings if f.op), None)
    return op, kernel


def _outcome(r: CaseRecord) -> str:
    first = (
        next((f.message for f in r.errors() if f.kind in OUTCOME_KINDS), None)
        or (r.reason if r.status != "passed" else "")
        or ""
    )
    return f"{r.status}{': ' + first if first else ''}"


def diagnose(
    originals: Iterable[CaseRecord],
    target_current: Iterable[CaseRecord],
    control: Iterable[CaseRecord] | None = None,
) -> list[Finding]:
    """wrong-device findings for the suspects that pass with their target current — and,
    when a control re-run (another device current again) was made, go wrong again there.
    A suspect whose control passes did not reproduce: a ``not-reproducible`` warning instead
    (the original finding stands)."""
    again = {_key(r): r for r in target_current}
    checked = None if control is None else {_key(r): r for r in control}
    found = []
    for r in originals:
        other = again.get(_key(r))
        if other is None or not _clean(other):
            continue  # not re-run, or wrong there too: the original finding stands
        device, current = r.device, r.current_device
        ctrl = None if checked is None else checked.get(_key(r))
        if ctrl is not None and not _went_wrong(ctrl):
            found.append(
                r.info.finding(
                    "not-reproducible",
                    "warning",
                    (
                        f"went wrong once on {device} with {current} current, but passed when "
                        f"run again both ways (fresh processes): not a device bug as far as "
                        "the re-runs show; a random input or a race?"
                    ),
                    evidence=(
                        f"first, with {current} current ({r.mode}): {_outcome(r)}\n"
                        f"again with {device} current ({other.mode}): "
                        f"{_outcome(other)}\nagain with {current} current "
                        f"({ctrl.mode}): {_outcome(ctrl)}"
                    ),
                    hint="run the case repeatedly (pytest --count / a loop over seeds) to find "
                    "what makes it fail; print the seed of random inputs",
                )
            )
            continue
        fn, kernel = extension_function(r)
        where = f"`{fn}`" if fn else "every entry point of the extension this case calls"
        control_line = (
            ""
            if ctrl is None
            else f"\nagain with {current} current, fresh process ({ctrl.mode}): {_outcome(ctrl)}"
        )
        found.append(
            r.info.finding(
                "wrong-device",
                "error",
                (
                    f"goes wrong on {device} only while {current} is current, and passes with "
                    f"{device} current: {'`' + fn + '`' if fn else 'the op'} launches on the "
                    "current device instead of its inputs' device (missing device guard)"
                ),
                op=fn,
                kernel=kernel,
                evidence=(
                    f"with {current} current ({r.mode}): {_outcome(r)}\n"
                    f"with {device} current, fresh process, no other device touched "
                    f"({other.mode}): {_outcome(other)}{control_line}"
                ),
                hint=HINT.format(where=where),
            )
        )
    return found


#: a case that fails only with another device current: its op runs on the wrong device (the
#: root cause of its kernel's fault, first in the precedence)
WRONG_DEVICE = Kind("wrong-device", precedence=10)
#: a failure on two GPUs that the re-runs do not reproduce: it explains the case's failure
#: although a warning
NOT_REPRODUCIBLE = Kind("not-reproducible", precedence=150, explains_as_warning=True)


class WrongDevice(BaseDetector):
    """Parent side: pairs every other-device-current mode with its target-current twin."""

    name = "wrong-device"
    kinds = (WRONG_DEVICE, NOT_REPRODUCIBLE)

    def run_finished(self, records: list[CaseRecord]) -> list[Finding]:
        by_mode = {r.mode: try_parse(r.mode) for r in records}
        found: list[Finding] = []
        for mode in sorted(m for m, p in by_mode.items() if p is not None and not p.variant):
            twins = _arranged(records, by_mode, mode, (modes.TARGET_CURRENT, modes.RERUN_TARGET))
            control = _arranged(records, by_mode, mode, (modes.RERUN_CONTROL,))
            if twins:
                found += diagnose(suspects(records, mode), twins, control or None)
        return found


def _arranged(
    records: list[CaseRecord], by_mode: dict[str, Mode | None], mode: str, variants: tuple[str, ...]
) -> list[CaseRecord]:
    """The records of pass ``mode`` run in one of these arrangements."""
    out = []
    for r in records:
        p = by_mode.get(r.mode)
        if p is not None and str(p.pass_base) == mode and p.variant in variants:
            out.append(r)
    return out
