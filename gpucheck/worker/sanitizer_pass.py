"""A worker's side of a sanitizer pass: its compute-sanitizer logs, read case by case.

compute-sanitizer writes its records to a log per process (``--log-file``, ``%p``: a pid of
its own choosing, and a case's child processes get their own). The worker reads each log from
where the last case ended (``offsets``, kept in its state file so that the controller knows
what no case claimed) and turns the case's slice into findings, traced to the case's watched
calls where they can be (:mod:`gpucheck.detectors.sanitizer_trace`).

**The print budget is per case.** The tool prints at most
:data:`~gpucheck.sanitizer.command.PRINT_LIMIT` records per process and only counts the rest
(its ``ERROR SUMMARY`` at the process's end). After each case the worker counts the records
its logs hold: when fewer than :data:`~gpucheck.sanitizer.command.CASE_RECORDS` are left, it
ends (``EXIT_SANITIZER_LIMIT``) and the controller starts a fresh one (a fresh tool) for the
next cases; when the limit itself was reached during a case, its state file names that case,
and the controller adds the number of records the tool did not print, from its summary, as a
finding of that case. No case runs with its budget spent, silently.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from gpucheck.detectors.base import CaseInfo
from gpucheck.detectors.sanitizer_trace import SanitizerTrace
from gpucheck.model.results import Finding
from gpucheck.sanitizer import command as sanitizer_cmd
from gpucheck.sanitizer.findings import read_records
from gpucheck.sanitizer.parser import placed, printed


class SanitizerPass:
    """The logs of one worker under compute-sanitizer (``template``: ``--log-file``'s)."""

    def __init__(self, template: str, tool: str | None) -> None:
        # every log of this worker: the tool's pid is not always ours, and children get theirs
        self.glob = Path(template.replace("%p", "*")).absolute()
        self.tool = tool
        self.offsets: dict[str, int] = {}
        self.printed: dict[str, int] = {}  # log -> records it holds (its print budget)
        self.trace = SanitizerTrace(self.logs)
        self.limited: tuple[str, str] | None = None  # (suite, case) that reached the limit

    def logs(self) -> list[Path]:
        return sorted(self.glob.parent.glob(self.glob.name))

    def findings(self, info: CaseInfo, other_current: bool) -> list[Finding]:
        """Records compute-sanitizer wrote to this worker's logs while the case ran."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            with contextlib.suppress(RuntimeError):  # a lost context: the log is all there is
                torch.cuda.synchronize()
        found: list[Finding] = []
        for log in self.logs():
            start = self.offsets.get(str(log), 0)
            text, end = read_records(log, start)
            self.offsets[str(log)] = end
            if not text:
                continue
            count = printed([r for _, r in placed(text, self.tool)])
            self.printed[str(log)] = self.printed.get(str(log), 0) + count
            if self.printed[str(log)] >= sanitizer_cmd.PRINT_LIMIT and self.limited is None:
                self.limited = (info.suite, info.case)  # the tool printed no more after these
            found += self.trace.findings(str(log), start, text, self.tool, info, other_current)
        self.trace.clear()
        return found

    def budget_spent(self) -> bool:
        """Whether a log holds so many records that the next case could not print its
        :data:`~gpucheck.sanitizer.command.CASE_RECORDS`: a fresh worker runs the next ones."""
        left = sanitizer_cmd.PRINT_LIMIT - max(self.printed.values(), default=0)
        return left < sanitizer_cmd.CASE_RECORDS
