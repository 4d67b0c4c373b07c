"""A worker's side of a sanitizer pass: its compute-sanitizer logs, read case by case.

compute-sanitizer writes its records to a log per process (``--log-file``, ``%p``: a pid of
its own choosing, and a case's child processes get their own). The worker reads each log from
where the last case ended (``offsets``, kept in its state file so that the controller knows
what no case claimed) and turns the case's slice into findings, traced to the case's watched
calls where they can be (:mod:`gpucheck.detectors.sanitizer_trace`), once the logs have
stopped growing (the tool may write a kernel's records some milliseconds after the call that
launched it returned).

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
import time
from pathlib import Path

from gpucheck.detectors.base import CaseInfo
from gpucheck.detectors.sanitizer_trace import SanitizerTrace
from gpucheck.model.results import Finding
from gpucheck.sanitizer import command as sanitizer_cmd
from gpucheck.sanitizer import open_calls
from gpucheck.sanitizer.findings import read_records
from gpucheck.sanitizer.parser import placed, printed

#: how long the logs may keep growing after a case before they are read, and how often looked
SETTLE_S, SETTLE_STEP_S = 0.5, 0.01


class SanitizerPass:
    """The logs of one worker under compute-sanitizer (``template``: ``--log-file``'s)."""

    def __init__(self, template: str, tool: str | None) -> None:
        # every log of this worker: the tool's pid is not always ours, and children get theirs
        self.glob = Path(template.replace("%p", "*")).absolute()
        self.tool = tool
        self.offsets: dict[str, int] = {}
        self.printed: dict[str, int] = {}  # log -> records it holds (its print budget)
        # a memcheck pass writes its calls under way beside its logs (the controller reads
        # them when the tool ends the worker inside a call)
        calls = open_calls.path_for(Path(template).absolute())
        self.trace = SanitizerTrace(self.logs, tool, calls)
        self.limited: tuple[str, str] | None = None  # (suite, case) that reached the limit

    def logs(self) -> list[Path]:
        return sorted(self.glob.parent.glob(self.glob.name))

    def findings(self, info: CaseInfo, other_current: bool) -> list[Finding]:
        """Records compute-sanitizer wrote to this worker's logs while the case ran."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            with contextlib.suppress(RuntimeError):  # a lost context: the log is all there is
                torch.cuda.synchronize()
        self._settle()
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

    def _settle(self) -> None:
        """Until the logs stop growing (at most :data:`SETTLE_S`): the tool writes a kernel's
        records when it has analysed it, which may be after the call that launched it
        returned; those of the case's last kernels belong to this case, not the next."""
        deadline = time.monotonic() + SETTLE_S
        sizes = self._sizes()
        while time.monotonic() < deadline:
            time.sleep(SETTLE_STEP_S)
            now = self._sizes()
            if now == sizes:
                return
            sizes = now

    def _sizes(self) -> dict[str, int]:
        sizes = {}
        for log in self.logs():
            with contextlib.suppress(OSError):
                sizes[str(log)] = log.stat().st_size
        return sizes

    def budget_spent(self) -> bool:
        """Whether a log holds so many records that the next case could not print its
        :data:`~gpucheck.sanitizer.command.CASE_RECORDS`: a fresh worker runs the next ones."""
        left = sanitizer_cmd.PRINT_LIMIT - max(self.printed.values(), default=0)
        return left < sanitizer_cmd.CASE_RECORDS
