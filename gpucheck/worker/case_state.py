"""A case under way in a ``gpucheck run`` worker: one object, from its start to its record.

The recorder makes a :class:`CaseState` when pytest starts an item (``logstart``) and keeps it
in the item's stash (``item.stash[CASE]``, pytest's typed per-item store); every hook of the
case (the body, the findings it attaches, its reports) adds to it, and when pytest is done
with the item (``logfinish``) the recorder turns it into the case's record in one place
(:meth:`gpucheck.worker.recorder.Recorder.build`) and drops it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from gpucheck.model import clock
from gpucheck.model.results import CaseData, CaseInfo, Finding
from gpucheck.worker import guard


@dataclass
class CaseState:
    """What the worker knows of one case while it runs."""

    nodeid: str
    #: where its findings go: the worker's device, the case's suite and id
    info: CaseInfo
    #: when it started: monotonic (its duration), as written in its record, epoch (the state
    #: file's)
    started: float = field(default_factory=time.monotonic)
    started_at: str = field(default_factory=clock.now)
    started_epoch: float = field(default_factory=time.time)
    #: the worker's working folder and CUDA variables before the case (put back after it)
    process_state: guard.ProcessState | None = None
    #: the worker's child processes before its body ran (None: the body did not run)
    children: set[int] | None = None
    #: PyTorch's allocated memory on the target when it started
    allocated_at_start: int | None = None
    #: pytest's reports of its phases (setup, call, teardown)
    reports: list[pytest.TestReport] = field(default_factory=list)
    #: the findings of its detectors and those it attached
    findings: list[Finding] = field(default_factory=list)
    #: what its detectors add to the record (fingerprints, comparisons, their seconds)
    data: CaseData = field(default_factory=CaseData)
    #: the extension op that raised in its body, else the last one it called
    op: str | None = None
    #: the extension op whose call raised (an extension's own error names it)
    raising_op: str | None = None
    #: the detectors that stood down after its CUDA error lost the context
    stood_down: list[str] = field(default_factory=list)
    #: seconds of the worker's own bookkeeping on it (``cost_s["record"]``)
    bookkeeping: float = 0.0

    def spent(self, seconds: float) -> None:
        """Seconds of the worker's own bookkeeping on the case."""
        self.bookkeeping += seconds


#: the case under way, in its item's stash
CASE = pytest.StashKey[CaseState]()
