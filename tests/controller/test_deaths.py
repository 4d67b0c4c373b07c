"""What a worker's end means (``WorkerEnd``: the harness acts on its ending), and the hint of
a worker's death: abort, lost context, segfault and the OOM killer told apart, and the device
guard named only when another device was current."""

from __future__ import annotations

import pytest

from gpucheck.controller.deaths import WorkerEnd, crash_hint
from gpucheck.model import worker_state
from gpucheck.model.contract import EXIT_CONTEXT_LOST, EXIT_OUTPUT_ERROR, EXIT_SANITIZER_LIMIT
from gpucheck.model.worker_state import WorkerState
from gpucheck.sanitizer.command import ERROR_EXIT


@pytest.mark.parametrize(
    ("rc", "stderr", "words"),
    [
        (
            -6,
            "terminate called after throwing an instance of 'thrust::system_error'",
            "C++ exception escaped",
        ),
        (-6, "CUDA error: an illegal memory access was encountered", "CUDA context was lost"),
        (-11, "Fatal Python error: Segmentation fault", "segmentation fault"),
        (-6, "python: foo.c:12: main: Assertion `x' failed.", "the process aborted"),
        (-9, "", "out-of-memory killer"),
        (3, "", "run it alone"),
    ],
)
def test_crash_hints_tell_abort_lost_context_and_segfault_apart(rc, stderr, words):
    assert words in crash_hint(rc, stderr)


def test_an_abort_hint_names_the_device_guard_only_with_another_device_current():
    stderr = "terminate called after throwing an instance of 'thrust::system_error'"
    assert "check the device guard" in crash_hint(-6, stderr, other_current=True)
    alone = crash_hint(-6, stderr, other_current=False)
    assert "not a device guard" in alone and "check the device guard" not in alone


def _end(rc, case=None, hung=None, sanitizer=False, tool=False, reason=None, pid=4321):
    state = WorkerState(pid=pid, case=case, exit_reason=reason)
    return WorkerEnd.of(rc, state, hung, sanitizer, tool, 1234, "")


@pytest.mark.parametrize(
    ("end", "ending"),
    [
        (_end(0), "finished"),
        (_end(1), "finished"),  # its cases failed: their records say so
        (_end(0, case="t.py::x"), "crashed"),  # os._exit(0) inside a case never finished it
        (_end(-11, case="t.py::x"), "crashed"),
        (_end(-9, hung="t.py::x"), "hung"),
        (_end(EXIT_CONTEXT_LOST, case="t.py::x"), "context-lost"),
        (_end(EXIT_OUTPUT_ERROR, case="t.py::x"), "output-error"),
        (_end(EXIT_SANITIZER_LIMIT, reason=worker_state.SANITIZER_LIMIT), "sanitizer-limit"),
        (_end(EXIT_SANITIZER_LIMIT), "worker-error"),  # the code alone is not the limit's
        (_end(2), "worker-error"),  # a usage error before any case
        (_end(-9), "worker-error"),  # killed while starting
        # compute-sanitizer's own exit code hides the worker's: its state tells
        (_end(ERROR_EXIT, sanitizer=True, reason=worker_state.CONTEXT_LOST), "context-lost"),
        (_end(ERROR_EXIT, sanitizer=True), "finished"),  # no case: its records say it all
        (_end(ERROR_EXIT, case="t.py::x", sanitizer=True), "crashed"),
        (_end(-11, case="t.py::x", sanitizer=True, tool=True), "tool-crash"),
        (_end(-11, sanitizer=True, tool=True), "worker-error"),
    ],
)
def test_what_a_workers_end_means(end, ending):
    assert end.ending == ending


def test_how_and_who_ended_for_the_record():
    assert _end(-11, case="t.py::x").how == "killed by SIGSEGV"
    assert _end(3, case="t.py::x").how == "exited with code 3"
    fatal = _end(ERROR_EXIT, case="t.py::x", sanitizer=True)
    assert fatal.how == "was ended by compute-sanitizer after a fatal error"
    assert fatal.who == "worker"
    assert _end(-6, sanitizer=True, tool=True).who == "compute-sanitizer (pid 1234)"
    unknown = _end(-6, sanitizer=True, pid=None)
    assert unknown.who == "compute-sanitizer (pid 1234) or the worker under it"
    # what it left goes on the case's record only when it died in that case
    assert _end(-11, case="t.py::x").in_case and not _end(0).in_case
    assert not _end(1, case="t.py::x").in_case
