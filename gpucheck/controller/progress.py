"""What `gpucheck run` prints: live progress per worker, and the end-of-run summary.

On a terminal, one rich progress bar per worker (cases done / total, current case, findings
so far). Without one (a CI log, ``| cat``) nothing is redrawn: rich's Console knows it is not
writing to a terminal and prints plain text, and each line is printed once: one line per
finding as its case record is written, one line per worker when it finishes. ``--quiet``
prints only the worker lines. Every line is a :class:`rich.text.Text` with styles, never
markup, so a case id such as ``test_x[cuda0]`` is printed as it is.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from rich import progress as rp
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpucheck.model.results import COLLECTION_ERROR, CaseRecord
from gpucheck.model.runlog import RunLog
from gpucheck.report.groups import Group, Grouped
from gpucheck.report.verdict import RAN, Verdict

if TYPE_CHECKING:
    from gpucheck.controller.harness import Worker

#: finding lines of one case record before "... and N more"
MAX_LINES_PER_RECORD = 5
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


class Progress:
    """Progress of the workers of every pass (see the module docstring)."""

    def __init__(self, console: Console, quiet: bool) -> None:
        self.quiet = quiet
        self.console = console
        self.live = console.is_terminal and not quiet
        self.bar = rp.Progress(
            rp.TextColumn("[bold]{task.fields[label]}"),
            rp.BarColumn(),
            rp.MofNCompleteColumn(),
            rp.TextColumn("findings {task.fields[findings]}"),
            rp.TextColumn("{task.fields[case]}", markup=False),
            console=console,
            disable=not self.live,
            transient=False,
        )
        self.tasks: dict[str, rp.TaskID] = {}
        self.reported: set[str] = set()
        self.log: RunLog | None = None
        self.seen = 0  # the log's cursor: records already looked at

    def __enter__(self) -> Progress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)
        self._findings()

    def follow(self, log: RunLog) -> None:
        """The results file the workers of the next pass append to (the controller's log of
        it: the records already in it are not shown again)."""
        self._findings()
        log.refresh()
        self.log = log
        _, self.seen = log.cases_since(0)

    def _findings(self) -> None:
        """One line per finding recorded since the last look (no terminal, not quiet)."""
        if self.live or self.quiet or self.log is None:
            return
        self.log.refresh()
        new, self.seen = self.log.cases_since(self.seen)
        for r in new:
            where = f"{r.device} {r.mode} {r.case}"
            same = Counter(
                (
                    f.kind,
                    f.severity,
                    f"{f.place}: {f.message}"
                    if (f.kind == COLLECTION_ERROR and f.place)
                    else f.message,
                )
                for f in r.findings
            )
            for n, ((kind, severity, message), count) in enumerate(same.items()):
                if n == MAX_LINES_PER_RECORD:
                    self.console.print(
                        f"  ... and {len(same) - n} more distinct finding(s) of {printable(where)}",
                        soft_wrap=True,
                        markup=False,
                    )
                    break
                self.console.print(
                    finding_text(kind, severity, where, message, count), soft_wrap=True
                )

    def update(self, w: Worker) -> None:
        label = f"{w.spec.label} {w.spec.mode}"
        done = w.finished and not w.replaced
        if self.live:
            st = w.state
            case = (st.get("case") or "").rsplit("::", 1)[-1][:60]
            if w.generation:
                case = f"(worker {w.generation + 1}) {case}"
            if label not in self.tasks:
                self.tasks[label] = self.bar.add_task(
                    "", total=None, label=label, findings=0, case=""
                )
            self.bar.update(
                self.tasks[label],
                total=w.planned,
                completed=w.done,
                findings=st.get("findings", 0),
                case="done" if done else case,
            )
            return
        self._findings()
        if done and label not in self.reported:
            self.reported.add(label)
            restarts = f", {w.generation} restart(s)" if w.generation else ""
            self.console.print(
                f"{label}: {w.done}/{w.planned or '?'} cases{restarts}, exit {w.proc.returncode}",
                soft_wrap=True,
                markup=False,
            )


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
