"""What a run prints on the terminal at its end (``gpucheck run``, ``gpucheck report``):
counts per device and suite, the notes, the findings (diagnoses first), the files written,
why the verdict is not a pass, and last the verdict with the case counts. Every line is a
:class:`rich.text.Text` with styles, never markup, and every text from a record is
:func:`printable`: a case id such as ``test_x[cuda0]`` is printed as it is, and one holding
escape codes cannot retitle, clear or recolour the terminal.
"""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpucheck.model.results import CaseRecord
from gpucheck.report import Published
from gpucheck.report.cost import cost_line, run_cost
from gpucheck.report.groups import Group, Grouped
from gpucheck.report.verdict import RAN, Verdict

#: groups listed in the summary before "... and N more in the report"
MAX_GROUPS = 15
SEVERITY_STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}


#: what a terminal would act on rather than show (C0 controls but tab, DEL, C1 controls): a
#: test id or message holding escape codes must not retitle, clear or recolour the terminal
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character shown as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def finding_text(kind: str, severity: str, where: str, message: str, count: int = 1) -> Text:
    """``kind: where: message`` with the kind coloured by severity (plain without a TTY)."""
    first = (message.splitlines() or [""])[0]
    text = Text.assemble(
        (printable(kind), SEVERITY_STYLE.get(severity, "")), printable(f": {where}: {first}")
    )
    if count > 1:
        text.append(f" (x{count})")
    return text


def summary_table(records: list[CaseRecord]) -> Table:
    """Device x suite -> counts per status."""
    counts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for r in records:
        counts[(r.device, r.suite)][r.status] += 1
    table = Table(title="gpucheck summary")
    for col in ("device", "suite", "passed", "failed", "error", "crashed", "hung", "skipped"):
        table.add_column(
            col, justify="left" if col in ("device", "suite") else "right", overflow="fold"
        )
    for (device, suite), c in sorted(counts.items()):
        bad = c["failed"] + c["error"] + c["crashed"] + c["hung"]
        style = "red" if bad else "green"
        table.add_row(
            Text(device),
            Text(suite),
            *(str(c[s]) for s in ("passed", "failed", "error", "crashed", "hung", "skipped")),
            style=style,
        )
    return table


def _group_text(g: Group, indent: str = "") -> Text:
    return Text.assemble(
        indent,
        (printable(g.kind), SEVERITY_STYLE.get(g.severity, "")),
        printable(g.line()[len(g.kind) :]),
    )


def print_findings(console: Console, grouped: Grouped, limit: int = MAX_GROUPS) -> None:
    """The run's findings, diagnoses first (each with what it explains), then the errors
    no diagnosis explains, then warnings and notes (:meth:`Grouped.ranked`); one line per
    (kind, op or kernel) group."""
    for title, groups in grouped.ranked():
        console.print(
            Text.assemble(
                (f"{title}:", "bold"),
                f" {len(groups)} group(s), {sum(g.count for g in groups)} finding(s)",
            )
        )
        for g in groups[:limit]:
            console.print(_group_text(g, "  "), soft_wrap=True)
        if len(groups) > limit:
            console.print(
                f"  ... and {len(groups) - limit} more group(s) in the report", markup=False
            )


#: how a verdict's reasons are introduced on the console
SAYS = {"nothing-tested": "nothing was tested"}


def print_verdict(console: Console, verdict: Verdict) -> None:
    """Why the verdict is not a pass (or has warnings), and what could not be read: one line
    each."""
    style = "green" if verdict.ok else "red"
    if not verdict.ok or verdict.name == "warnings":
        for why in verdict.why:
            console.print(
                Text.assemble(
                    (f"{SAYS.get(verdict.name, verdict.name)}:", style), printable(f" {why}")
                ),
                soft_wrap=True,
            )
    for problem in verdict.problems:
        if problem not in verdict.why:
            console.print(
                Text.assemble(("unreadable:", "red"), printable(f" {problem}")), soft_wrap=True
            )


def summary_line(records: list[CaseRecord], reasons: int = 3) -> tuple[str, int]:
    """How many cases ran, passed, failed..., were skipped and why.

    Returns the line and the number of cases that ran.
    """
    counts = Counter(r.status for r in records)
    ran = sum(counts[s] for s in RAN)
    parts = ", ".join(f"{counts[s]} {s}" for s in RAN if counts[s] or s in ("passed", "failed"))
    line = f"{len(records)} case(s): {ran} ran ({parts}), {counts['skipped']} skipped"
    why = Counter(r.reason or "no reason given" for r in records if r.status == "skipped")
    if why:
        top = "; ".join(f"{reason} ({n})" for reason, n in why.most_common(reasons))
        more = f"; {len(why) - reasons} more reason(s)" if len(why) > reasons else ""
        line += f": {top}{more}"
    return line, ran


def print_summary(
    console: Console,
    done: Published,
    notes: list[str],
    not_runnable: dict[str, str],
    results_path: Path,
    stopped: str | None,
    reruns: Iterable[CaseRecord] = (),
) -> None:
    """The end of a run on the console: counts per device and suite, notes, the findings
    (diagnoses first), the files written, why the verdict is not a pass, what the checks
    cost (``reruns``: the wrong-device re-runs' records), and last the verdict with the case
    counts."""
    records = done.data.cases
    console.print(summary_table(records))
    for note in notes:
        console.print(Text.assemble(("note:", "yellow"), f" {note}"))
    print_findings(console, done.grouped)
    for name, reason in not_runnable.items():
        console.print(Text.assemble((f"suite {name}:", "red"), f" {reason}"))
    written = "  ".join(f"{fmt}: {path}" for fmt, path in done.paths.items())
    console.print(Text(f"results: {results_path}  {written}"))
    if stopped is not None and stopped not in done.verdict.why:
        console.print(Text.assemble(("interrupted:", "yellow"), f" {stopped}"))
    if done.data.invocations:  # what the checks cost: gpucheck's own share of the run
        wall = done.data.active_seconds(time.time())
        merged = done.data.header is not None and bool(done.data.header.parts)
        console.print(Text(cost_line(run_cost(records, wall, reruns, merged)), style="dim"))
    print_verdict(console, done.verdict)
    line, _ = summary_line(records)
    style = "green" if done.verdict.ok else "red"
    console.print(
        Text.assemble((f"{done.verdict.name} (exit {done.verdict.exit_code})", style), f": {line}")
    )
