"""What the wrong-device re-runs found besides the outcome: reported on the case they re-ran.

On two GPUs a case with a missing device guard faults with another device current, so its
own record holds only the crash; the re-run with its target current then passes, and the
other detectors see what they would have seen on one GPU (the legacy-stream launches, a leak).
Those findings belong to the case: :func:`carried` copies them onto it, deduplicated with
what its own record already says, so a two-GPU run reports what a one-GPU run reports.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from gpucheck.model import modes
from gpucheck.model.kinds import DIAGNOSIS
from gpucheck.model.modes import try_parse
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.report.groups import role, subject


def _what(f: Finding) -> tuple[str, str | None]:
    return (f.kind, subject(f))


def carried(records: Iterable[CaseRecord]) -> list[Finding]:
    """The diagnoses (not symptoms: a re-run's own failure is about the re-run) of every
    ``|rerun:target-current`` record that the case's own record (its pass without a variant)
    does not already hold, one per (kind, subject) and case, each saying where it was seen."""
    records = list(records)
    own: dict[tuple[str, str, str, str], set[tuple[str, str | None]]] = {}
    for r in records:
        parsed = try_parse(r.mode)
        if parsed is not None and not parsed.variant:
            own[(r.device, r.suite, r.case, str(parsed))] = {_what(f) for f in r.findings}
    out: list[Finding] = []
    for r in records:
        parsed = try_parse(r.mode)
        if parsed is None or parsed.variant != modes.RERUN_TARGET:
            continue
        seen = own.get((r.device, r.suite, r.case, str(parsed.pass_base)))
        if seen is None:
            continue  # the case's own record is not in this run
        for f in r.findings:
            if role(f, r) != DIAGNOSIS or _what(f) in seen:
                continue
            seen.add(_what(f))
            note = (
                f"seen in the wrong-device check's re-run with {r.device} current "
                f"({r.mode}), where the case ran to its end"
            )
            out.append(
                replace(
                    f,
                    device=r.device,
                    suite=r.suite,
                    case=r.case,
                    evidence=f"{note}\n{f.evidence}" if f.evidence else note,
                )
            )
    return out
