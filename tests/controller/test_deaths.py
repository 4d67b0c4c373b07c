"""The hint of a worker's death: abort, lost context, segfault and the OOM killer told apart,
and the device guard named only when another device was current."""

from __future__ import annotations

import pytest

from gpucheck.controller.deaths import crash_hint


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
