"""The worker's detector loop: a failing detector is a warning, not a broken case; after a
lost CUDA context the detectors that read the GPU stand down with one note."""

from __future__ import annotations

import textwrap

import pytest
from clirun import run_suite

from gpucheck.model.results import CaseData


def _run_with_detector(tmp_path, detector: str, test: str) -> tuple[dict, str]:
    """``gpucheck run --cpu-only`` over one test file with one more worker detector
    (``detector``: a class body's source, named ``Extra``); the one case record, and the
    run's output."""
    conftest = textwrap.dedent(detector) + textwrap.dedent("""
        import gpucheck.worker.recorder as worker

        real = worker.worker_detectors
        worker.worker_detectors = lambda: [*real(), Extra()]
    """)
    files = {"conftest.py": conftest, "test_d.py": textwrap.dedent(test)}
    proc, recs = run_suite(tmp_path, "d", files)
    [rec] = recs.values()
    return rec, proc.stdout + proc.stderr


def test_a_failing_detector_is_a_warning_not_a_broken_case(tmp_path):
    rec, said = _run_with_detector(
        tmp_path,
        """
        from gpucheck.detectors import base

        class Extra(base.BaseDetector):
            name = "broken"
            def case_started(self, case):
                raise RuntimeError("cannot start")
    """,
        "def test_ok():\n    assert True\n",
    )
    assert rec["status"] == "passed", said
    assert [(f["kind"], f["severity"]) for f in rec["findings"]] == [("detector-error", "warning")]
    assert "cannot start" in rec["findings"][0]["message"]


def test_after_a_lost_context_the_gpu_detectors_stand_down_with_one_note():
    """After an illegal address every GPU call fails the same way: the detectors that read
    the GPU are ended without a word (no detector-error per case), those that judged the
    calls before the error keep their findings, and the loop names who stood down."""
    from gpucheck.detectors.base import BaseDetector, CaseInfo
    from gpucheck.model.results import Finding
    from gpucheck.worker.detector_loop import DetectorLoop, stood_down_note

    info = CaseInfo("cuda:1", "zoo", "test_r.py::test_render[cuda1]")

    class Trace(BaseDetector):  # reads the profiler: fails on a lost context
        name = "wrong-stream"

        def case_finished(self, case):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    class Numbers(BaseDetector):  # reads results back: would report garbage
        name = "numerics"

        def case_finished(self, case):
            return [Finding("numerics", "error", "non-deterministic")]

    class Args(BaseDetector):  # judged the arguments before the call
        name = "mixed-devices"
        touches_gpu = False

        def case_finished(self, case):
            return [Finding("mixed-devices", "error", "bg on cpu")]

    loop = DetectorLoop([Trace(), Numbers(), Args()])
    found: list[Finding] = []
    loop.start(info, found)
    down = loop.finish(info, found, CaseData(), lost_context=True)
    assert [f.kind for f in found] == ["mixed-devices"]
    assert down == ["wrong-stream", "numerics"]
    assert "stood down for this case (wrong-stream, numerics)" in stood_down_note(down)
    # with the context intact the same failure is a warning, and every finding counts
    found = []
    loop.start(info, found)
    assert loop.finish(info, found, CaseData()) == []
    assert [f.kind for f in found] == ["detector-error", "numerics", "mixed-devices"]


def test_a_case_that_lost_the_context_gets_one_note_and_no_detector_error(tmp_path):
    """Through a real worker: a detector that fails after the case's illegal address stands
    down (before, it added a detector-error to every such case); the CUDA error carries the
    one note, and its hint names no device guard (the case's own device was current)."""
    rec, said = _run_with_detector(
        tmp_path,
        """
        from gpucheck.detectors import base

        class Extra(base.BaseDetector):
            name = "reads-the-gpu"
            def case_finished(self, case):
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
    """,
        """
        def test_faults():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    """,
    )
    assert rec["status"] == "failed", said
    [f] = rec["findings"]
    assert f["kind"] == "cuda-error"
    assert "stood down for this case (" in f["evidence"] and "reads-the-gpu" in f["evidence"]
    assert "OptionalCUDAGuard" not in f["hint"] and "not a device guard" in f["hint"]


def test_the_loop_times_each_detector_on_the_case(tmp_path):
    """``cost_s``: each detector's seconds on a case (start, repeats and finish together)
    go to the case's data, added to what is there; a detector that does nothing costs ~0."""
    import time

    from gpucheck.detectors.base import BaseDetector, CaseInfo
    from gpucheck.worker.detector_loop import DetectorLoop

    class Slow(BaseDetector):
        name = "slow"

        def case_started(self, case):
            time.sleep(0.02)

        def repeat(self, body, times):
            for _ in range(times):
                body()

        def case_finished(self, case):
            time.sleep(0.03)
            return []

    class Idle(BaseDetector):
        name = "idle"

    info = CaseInfo("cuda:0", "s", "test_a.py::test_a")
    loop = DetectorLoop([Slow(), Idle()])
    data = CaseData(cost_s={"slow": 1.0})
    loop.start(info, [])
    loop.repeat(lambda: time.sleep(0.01), 2)
    loop.finish(info, [], data)
    assert 1.06 <= data.cost_s["slow"] < 1.5
    assert 0 <= data.cost_s["idle"] < 0.01


def test_the_watch_around_the_cases_op_calls_is_its_own_cost():
    """The seconds each per-call listener took around the case's extension-op calls, under
    its name (``op-watch``: the watch's own part), the body's own time left out; a detector
    that repeats the body is not charged for the listeners around the repeated calls."""
    import time

    import torch  # noqa: F401  (the watch needs torch imported)

    from gpucheck.detectors import op_watch
    from gpucheck.detectors.base import BaseDetector, CaseInfo
    from gpucheck.worker.detector_loop import DetectorLoop

    class SlowListener:
        name = "slow-listener"

        def before(self, call):
            time.sleep(0.01)

        def after(self, call, out):
            time.sleep(0.01)

    class Repeats(BaseDetector):
        name = "repeats"

        def repeat(self, body, times):
            for _ in range(times):
                body()

    def body():
        op_watch.watch_call("ns::op", lambda: time.sleep(0.05))

    info = CaseInfo("cpu", "s", "test_a.py::test_a")
    loop = DetectorLoop([Repeats()])
    data = CaseData()
    listener = SlowListener()
    assert op_watch.add(listener)
    try:
        loop.start(info, [])
        body()  # the case's own call: 0.05 s of body, 0.02 s of watch
        loop.repeat(body, 2)  # two more calls
        loop.finish(info, [], data)
    finally:
        op_watch.remove(listener)
    assert 0.06 <= data.cost_s["slow-listener"] < 0.1  # 3 calls x 0.02 s
    assert 0 < data.cost_s["op-watch"] < 0.01  # the watch's own part of the 3 calls
    assert 0.1 <= data.cost_s["repeats"] < 0.14  # the two repeated bodies, watch left out


def test_a_listener_without_a_name_is_charged_under_its_class_also_when_the_op_raises():
    import time

    import torch  # noqa: F401  (the watch needs torch imported)

    from gpucheck.detectors import op_watch
    from gpucheck.detectors.base import CaseInfo
    from gpucheck.worker.detector_loop import DetectorLoop

    class Unnamed:
        def before(self, call):
            pass

        def after(self, call, out):
            if call.error is not None:
                time.sleep(0.03)

    def fails():
        raise ValueError("the op refused")

    info = CaseInfo("cpu", "s", "test_a.py::test_a")
    loop = DetectorLoop([])
    data = CaseData()
    listener = Unnamed()
    assert op_watch.add(listener)
    try:
        loop.start(info, [])
        with pytest.raises(ValueError, match="refused"):
            op_watch.watch_call("ns::op", fails)
        loop.finish(info, [], data)
    finally:
        op_watch.remove(listener)
    assert 0.03 <= data.cost_s["Unnamed"] < 0.06
    assert op_watch.take_spent() == {}  # taken by the case
