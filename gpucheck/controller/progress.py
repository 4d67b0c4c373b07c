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

import functools
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpucheck.model.results import COLLECTION_ERROR, shown_path
from gpucheck.model.runlog import RunLog

if TYPE_CHECKING:  # imported once a line is shown (the first workers start before)
    from rich import progress as rp
    from rich.console import Console

    from gpucheck.controller.harness import Worker

#: finding lines of one case record before "... and N more"
MAX_LINES_PER_RECORD = 5


def ending(w: Worker) -> str:
    """What a finished worker's end means for the run, for its line (pytest's exit code says
    whether its own cases passed, which the run's verdict says for all): every case it
    planned recorded, some not, none collected, or an end outside any case."""
    if w.worker_error:
        return "stopped outside any case (its worker-error record says why)"
    if w.planned is None:  # it ended before it collected (its plan is written then)
        return f"collected no case (its stderr: {shown_path(str(w.stderr_path))})"
    if not w.planned:
        return "collected no case"
    missing = w.planned - w.done
    return "every case recorded" if missing <= 0 else f"{missing} case(s) not recorded"


class Progress:
    """Progress of the workers of every pass (see the module docstring). ``console``: the
    run's console, or what makes it when the first line is shown (rich imported then)."""

    def __init__(self, console: Console | Callable[[], Console], quiet: bool) -> None:
        self.quiet = quiet
        self.make_console: Callable[[], Console] = console if callable(console) else lambda: console
        self.bar: rp.Progress | None = None  # the live bars, from the first worker shown
        self.tasks: dict[str, rp.TaskID] = {}
        self.reported: set[str] = set()
        self.log: RunLog | None = None
        self.seen = 0  # the log's cursor: records already looked at

    @functools.cached_property
    def console(self) -> Console:
        return self.make_console()

    @functools.cached_property
    def live(self) -> bool:
        """Bars redrawn in place: on a terminal, not quiet."""
        return not self.quiet and self.console.is_terminal

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
        self._findings()

    def _bars(self) -> rp.Progress:
        if self.bar is None:
            from rich import progress as rp

            self.bar = rp.Progress(
                rp.TextColumn("[bold]{task.fields[label]}"),
                rp.BarColumn(),
                rp.MofNCompleteColumn(),
                rp.TextColumn("findings {task.fields[findings]}"),
                rp.TextColumn("{task.fields[case]}", markup=False),
                console=self.console,
                transient=False,
            )
            self.bar.__enter__()
        return self.bar

    def follow(self, log: RunLog) -> None:
        """The results file the workers of the next pass append to (the controller's log of
        it: the records already in it are not shown again)."""
        self._findings()
        log.refresh()
        self.log = log
        _, self.seen = log.cases_since(0)

    def _findings(self) -> None:
        """One line per finding recorded since the last look (no terminal, not quiet)."""
        if self.quiet or self.log is None or self.live:
            return
        from gpucheck.report.console import finding_text, printable
        from gpucheck.report.groups import in_order

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
                for f in in_order(r)  # the diagnosis before the assert it explains
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
            if w.restarts:
                case = f"(worker {w.restarts + 1}) {case}"
            bar = self._bars()
            if label not in self.tasks:
                self.tasks[label] = bar.add_task("", total=None, label=label, findings=0, case="")
            bar.update(
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
            restarts = f", {w.restarts} restart(s)" if w.restarts else ""
            self.console.print(
                f"{label}: {w.done}/{w.planned or '?'} cases{restarts}, {ending(w)}",
                soft_wrap=True,
                markup=False,
            )
