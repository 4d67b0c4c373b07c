"""The verdict of a run: ONE function decides it, for every output that states it.

``gpucheck run`` (its last lines and exit code), ``gpucheck report`` (its line and exit code),
``results.json`` (``summary.verdict``), ``report.html`` (title and badge), ``junit.xml`` (the
``gpucheck`` test suite) and ``results.sarif`` (the invocation) all take the verdict from
:func:`decide`. The rules, first match wins:

=================  ==========================================================  =========
verdict            when                                                        exit code
=================  ==========================================================  =========
``failed``         a finding of severity error, or a case failed, errored,     1
                   crashed or hung
``interrupted``    the run was stopped (Ctrl-C, SIGTERM, the harness died)     2 [#]_
                   before every case ran
``incomplete``     lines of results.jsonl could not be read, a suite could     2
                   not run at all, or a case a worker planned has no record
                   (a shard missing from a merged run, a rank that did not
                   record its cases)
``nothing-tested`` no case ran (every case skipped, or none selected)          2, or 0
                                                                               with
                                                                               --allow-empty
``warnings``       findings of severity warning only                           0
``passed``         at least one case ran, and nothing above                    0
=================  ==========================================================  =========

.. [#] ``gpucheck run`` that was stopped by a signal exits 130 (Ctrl-C) or 143 (SIGTERM),
   whatever the verdict, as shells expect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpucheck.errors import EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE
from gpucheck.model.layout import RunFolder
from gpucheck.model.results import BAD_STATUSES, COLLECTION_ERROR, CaseRecord, Status
from gpucheck.report.rundata import RunData

#: every verdict, worst first
VERDICTS = ("failed", "interrupted", "incomplete", "nothing-tested", "warnings", "passed")
#: statuses of a case that ran (a skipped case did not)
RAN: tuple[Status, ...] = ("passed", "failed", "error", "crashed", "hung")
#: exit codes of a run stopped by a signal
SIGNAL_EXITS = {"SIGTERM": 143}
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Verdict:
    """What a run proves, and the exit code that says it.

    Attributes:
        name: one of :data:`VERDICTS`.
        exit_code: the process exit code of the command that states it.
        why: one sentence per reason the verdict is not ``passed`` (empty for a pass), each
            naming what to look at.
        problems: what could not be read, whatever the verdict (torn lines of
            results.jsonl, ...): the command line names each of them.
    """

    name: str
    exit_code: int
    why: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the run passes a CI gate: its exit code is 0 (``passed``, ``warnings``,
        or ``nothing-tested`` with --allow-empty)."""
        return self.exit_code == EXIT_CLEAN

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.name,
            "exit_code": self.exit_code,
            "why": self.why,
            "problems": self.problems,
        }


def not_runnable(data: RunData) -> dict[str, str]:
    """Suites of the run's last invocation that could not run at all, with the reason."""
    latest = data.resumes[-1] if data.resumes else data.header
    return dict(latest.not_runnable) if latest is not None else {}


def uncollectable(cases: list[CaseRecord]) -> dict[str, str]:
    """Suites none of whose files could be collected (every record of the suite a
    ``collection-error``: a syntax or import error in its only file), with the reason: the
    error and where it is (``path:line``). Such a suite could not run at all."""
    by_suite: dict[str, list[CaseRecord]] = {}
    for r in cases:
        by_suite.setdefault(r.suite, []).append(r)
    out = {}
    for suite, records in by_suite.items():
        found = [f for r in records for f in r.findings if f.kind == COLLECTION_ERROR]
        if found and all(any(f.kind == COLLECTION_ERROR for f in r.findings) for r in records):
            first = found[0]
            out[suite] = f"{first.place}: {first.message}" if first.place else first.message
    return out


def _allow_empty(data: RunData) -> bool:
    return data.header is not None and data.header.config.allow_empty


def decide(
    data: RunData, *, allow_empty: bool | None = None, stopped_by: str | None = None
) -> Verdict:
    """The verdict of the run in ``data``.

    Args:
        data: the run folder as read by :func:`gpucheck.report.rundata.load`.
        allow_empty: a run in which no case ran exits 0 (default: the run's own
            ``--allow-empty`` setting, from its header).
        stopped_by: ``"Ctrl-C"`` or ``"SIGTERM"`` when the calling ``gpucheck run`` itself
            was stopped by a signal: the exit code is then 130 or 143.

    Returns:
        The :class:`Verdict`.
    """
    broken = uncollectable(data.cases)  # could not run: incomplete, not failed
    cases = [r for r in data.cases if r.suite not in broken]
    errors = [f for r in cases for f in r.errors()]
    bad = [r for r in cases if r.status in BAD_STATUSES]
    warnings = [f for r in cases for f in r.findings if f.severity == "warning"]
    ran = sum(r.status in RAN for r in cases)
    problems = []
    if data.torn_lines and data.header is None and not data.cases and not data.interrupted:
        problems.append(
            f"{RunFolder(data.run_dir).results} is not a gpucheck results file: "
            f"none of its {data.torn_lines} line(s) is a record gpucheck writes "
            "(no run header, no case)"
        )
    elif data.torn_lines:
        problems.append(
            f"{data.torn_lines} line(s) of {RunFolder(data.run_dir).results} could "
            "not be read (a writer was killed mid-line, or the file was edited): "
            "the cases they held are missing from every report"
        )
    skipped_suites = {**not_runnable(data), **broken}
    if allow_empty is None:
        allow_empty = _allow_empty(data)
    name, code, why = "passed", EXIT_CLEAN, []
    if errors or bad:
        name, code = "failed", EXIT_FINDINGS
        why.append(
            f"{len(errors)} finding(s) of severity error; {len(bad)} case record(s) "
            "failed, errored, crashed or hung"
        )
    elif data.interrupted:
        name, code = "interrupted", EXIT_USAGE
        why += data.interrupted
    elif problems or skipped_suites or data.missing:
        name, code = "incomplete", EXIT_USAGE
        why += problems
        why += [f"suite {suite} did not run: {reason}" for suite, reason in skipped_suites.items()]
        why += data.missing
    elif ran == 0:
        name, code = "nothing-tested", EXIT_CLEAN if allow_empty else EXIT_USAGE
        why.append(
            "no case ran, so this run proves nothing"
            + ("" if allow_empty else " (pass --allow-empty if that is expected)")
        )
    elif warnings:
        name = "warnings"
        why.append(f"{len(warnings)} finding(s) of severity warning")
    if stopped_by is not None:
        code = SIGNAL_EXITS.get(stopped_by, EXIT_INTERRUPTED)
    return Verdict(name, code, why, problems)
