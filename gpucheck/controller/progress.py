"""What `gpucheck run` prints while it runs: live progress per worker (the summary at its
end: :mod:`gpucheck.report.console`).

On a terminal, one rich progress bar per worker (cases done / total, current case, findings
so far). Without one (a CI log, ``| cat``) nothing is redrawn: rich's Console knows it is not
writing to a terminal and prints plain text, and each line is printed once: one line per
finding as its case record is written, one line per worker when it finishes. ``--quiet``
prints only the worker lines. Every line is a :class:`rich.text.Text` with styles, never
markup, so a case id such as ``test_x[cuda0]`` is printed as it is.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from rich import progress as rp
from rich.console import Console

from gpucheck.model.results import COLLECTION_ERROR
from gpucheck.model.runlog import RunLog
from gpucheck.report.console import finding_text, printable

if TYPE_CHECKING:
    from gpucheck.controller.harness import Worker

#: finding lines of one case record before "... and N more"
MAX_LINES_PER_RECORD = 5


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
            case = (w.state.case or "").rsplit("::", 1)[-1][:60]
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
                findings=w.state.findings,
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
