"""wrong-stream and kernel-device: the launch trace's judgement on windows recorded on a GPU
(tests/fixtures/launches/, see the README there) and on windows changed the ways a defect
would change them; and the trace's guards without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st

from gpucheck.detectors import CaseInfo, KernelDevice, WrongStream, worker_detectors
from gpucheck.detectors import launch_trace as lt
from gpucheck.detectors import launch_windows as lw
from gpucheck.detectors.launch_windows import Window, attribute, judge
from gpucheck.detectors.wrong_stream import findings, misplaced

FIXTURES = Path(__file__).parents[1] / "fixtures" / "launches"
CASE = CaseInfo("cuda:0", "selftest", "test_defect_stream.py::test_legacy_stream_ssim[cuda0]")


def windows(name: str) -> list[Window]:
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    return [
        Window(w["events"], w["log"], {int(k): v for k, v in w["streams"].items()})
        for w in data["windows"]
    ]


def launches(name: str) -> list[lw.OpLaunch]:
    return [lc for w in windows(name) for lc in attribute(w.events, w.log)]


def wrong_stream(ws: list[Window]) -> list:
    return findings(CASE, misplaced(ws, "wrong-stream"))


def test_markers_give_each_call_its_current_stream():
    ws = windows("clean_ssim")
    assert len(ws) == 1 and ws[0].log
    ops = {lc.op for lc in launches("clean_ssim")}
    assert ops == {"gpucheck::ssim_forward", "gpucheck::ssim_backward"}
    for lc in launches("clean_ssim"):
        assert (lc.work.device, lc.work.stream) == (lc.device, lc.stream)  # the poisoned stream
        assert lw.MARKER_KERNEL not in lc.work.name


def test_clean_ssim_has_no_finding():
    assert judge(launches("clean_ssim")) == []


def test_legacy_stream_ssim_names_op_and_kernel():
    found = wrong_stream(windows("legacy_stream_ssim"))
    ops = {f.op for f in found}
    assert ops == {
        "gpucheck_defect_legacy_stream::ssim_forward",
        "gpucheck_defect_legacy_stream::ssim_backward",
    }
    expected = {lc.stream for lc in launches("legacy_stream_ssim")}
    assert len(expected) == 1
    for f in found:
        assert (f.kind, f.severity, f.device, f.suite, f.case) == (
            "wrong-stream",
            "error",
            CASE.device,
            CASE.suite,
            CASE.case,
        )
        assert f.kernel and "ssim" in f.kernel and f.kernel in f.message
        assert f"is {next(iter(expected))}" in (f.evidence or "")
        assert "getCurrentCUDAStream()" in (f.hint or "")


def test_torch_ops_on_other_streams_are_fine():
    """aten ops on stream 0 and on a private stream, and an extension op on that private
    stream (made current by the test itself): no finding."""
    assert judge(launches("torch_streams")) == []
    ssim = [lc for lc in launches("torch_streams") if lc.op == "gpucheck::ssim_forward"]
    assert ssim and all(lc.work.stream == lc.stream for lc in ssim)
    data = json.loads((FIXTURES / "torch_streams.json").read_text())
    # the op ran with the test's private stream current, not the harness's poisoned stream
    assert windows("torch_streams")[0].streams[0] != data["current_stream"]


def test_knn_on_the_tests_own_stream_is_fine():
    assert any(lc.op == "gpucheck::knn_mean_sq_dist" for lc in launches("knn_side_stream"))
    assert judge(launches("knn_side_stream")) == []


def test_an_ext_kernel_on_another_stream_is_a_finding():
    """The clean window with the extension's kernels moved to stream 0's id (what the legacy
    stream defect does): a finding per kernel."""
    [w] = windows("clean_ssim")
    legacy = json.loads((FIXTURES / "legacy_stream_ssim.json").read_text())
    stream0 = next(e["stream"] for e in legacy["windows"][0]["events"] if "ssim" in e["name"])
    inside = {lc.work.correlation for lc in attribute(w.events, w.log)}
    moved = [dict(e, stream=stream0) if e["correlation"] in inside else e for e in w.events]
    found = wrong_stream([Window(moved, w.log, w.streams)])
    assert found and {f.op for f in found} == {"gpucheck::ssim_forward", "gpucheck::ssim_backward"}


def test_kernel_device_on_a_kernel_moved_to_another_gpu():
    """The clean window with the extension's kernels on cuda:1 while its inputs and markers
    are on cuda:0 (what a missing guard does with cuda:1 current): kernel-device findings;
    wrong-stream stays quiet (another device's stream is not judged against cuda:0's)."""
    [w] = windows("clean_ssim")
    inside = {lc.work.correlation for lc in attribute(w.events, w.log)}
    moved = [dict(e, device=1) if e["correlation"] in inside else e for e in w.events]
    ws = [Window(moved, w.log, w.streams)]
    kinds = {v.kind for v, _ in misplaced(ws, "kernel-device")}
    assert kinds == {"kernel-device"} and misplaced(ws, "wrong-stream") == []
    det = KernelDevice()
    det.trace = _Fixed(ws)
    found = det.case_finished(CASE)
    assert {f.op for f in found} == {"gpucheck::ssim_forward", "gpucheck::ssim_backward"}
    assert all(
        f.kind == "wrong-device"
        and "cuda:1" in f.message
        and "cuda:0" in f.message
        and "OptionalCUDAGuard" in f.hint
        for f in found
    )


def test_calls_across_devices_are_not_judged_for_kernel_device():
    [w] = windows("clean_ssim")
    inside = {lc.work.correlation for lc in attribute(w.events, w.log)}
    moved = [dict(e, device=1) if e["correlation"] in inside else e for e in w.events]
    log = [dict(e, single_device=False) for e in w.log]
    assert misplaced([Window(moved, log, w.streams)], "kernel-device") == []


def test_a_lost_marker_means_no_judgement():
    [w] = windows("legacy_stream_ssim")
    first = next(i for i, e in enumerate(w.events) if lw.MARKER_KERNEL in e["name"])
    events = w.events[:first] + w.events[first + 1 :]
    assert attribute(events, w.log) == []


@torch.library.custom_op("gpucheck_trace::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return 2 * x


class _Fixed:
    def __init__(self, ws):
        self.ws = ws

    def acquire(self):
        pass

    def finish(self):
        return self.ws

    def take_problems(self):
        return []


def test_no_cuda_no_window():
    """On a CPU build (or before CUDA is initialized) extension calls open no window."""
    trace = lt.LaunchTrace()
    trace.acquire()
    torch.ops.gpucheck_trace.twice(torch.rand(3))
    assert trace.finish() == [] and not trace.open


def test_registered_and_can_be_disabled(monkeypatch):
    names = [d.name for d in worker_detectors()]
    assert {"wrong-stream", "kernel-device", "numerics", "op-device"} <= set(names)
    monkeypatch.setenv("GPUCHECK_DISABLE_DETECTORS", "wrong-stream,numerics")
    names = [d.name for d in worker_detectors()]
    assert "wrong-stream" not in names and "numerics" not in names


def test_both_readers_get_the_same_windows():
    trace = lt.LaunchTrace()
    a, b = WrongStream(), KernelDevice()
    a.trace = b.trace = trace
    a.case_started(CASE)
    b.case_started(CASE)
    assert a.case_finished(CASE) == [] and b.case_finished(CASE) == []
    assert not trace.active


def test_poisoned_stream_keeps_the_poisoned_device(monkeypatch):
    """torch.cuda.set_stream also makes the stream's device current; the fixture's stream
    switch must leave the (poisoned) current device alone, on entry and on exit."""
    import torch

    from gpucheck.worker import poison

    state = {"device": 1, "stream": "default"}

    class FakeStream:
        def __init__(self, name, device=0):
            self.name, self.device_index = name, device

        def wait_stream(self, other):
            pass

    def set_stream(s):
        state["stream"], state["device"] = s.name, s.device_index

    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["device"])
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: state.update(device=d))
    monkeypatch.setattr(torch.cuda, "set_stream", set_stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: FakeStream(state["stream"]))
    monkeypatch.setattr(poison, "_STREAMS", {0: FakeStream("poisoned")})
    with poison.stream_made_current(torch.device("cuda", 0)) as s:
        assert s.name == "poisoned" and state == {"device": 1, "stream": "poisoned"}
    assert state == {"device": 1, "stream": "default"}


@given(
    st.lists(st.tuples(st.integers(0, 60), st.integers(1, 30)), max_size=12),
    st.lists(st.integers(0, 100), max_size=40),
)
def test_innermost_span_is_the_enclosing_one_that_began_last(spans, ids):
    """The sweep that gives each kernel its call agrees with the plain definition: of the
    spans with ``start < id < end``, the one with the latest start (nested or overlapping)."""
    from gpucheck.detectors.launch_windows import Work, innermost

    made = [(a, a + n, i, Work("spin_kernel", 0, 7, a), {}) for i, (a, n) in enumerate(spans)]
    work = [Work("k", 0, 7, c) for c in ids]
    got = innermost(work, made)
    for i, w in enumerate(work):
        inside = [s for s in made if s[0] < w.correlation < s[1]]
        if not inside:
            assert i not in got
        else:
            assert got[i][0] == max(s[0] for s in inside)


def test_gpuchecks_own_work_around_a_call_is_not_judged():
    """The recorded window of an op on stream 0, its first call relabelled as gpucheck's own
    work (an aside: the unwritten-output probe re-running the op): its kernels are neither the
    op's launches nor kernels without a caller."""
    w = windows("legacy_stream_ssim")[0]
    first = next(e for e in w.log if e["edge"] == "begin")
    log = [dict(e, op=lw.ASIDE) if e.get("call") == first["call"] else e for e in w.log]
    launched = [lc for lc in attribute(w.events, w.log) if lc.call == first["call"]]
    assert launched and judge(launched)  # as the op's: on the wrong stream
    assert all(lc.call != first["call"] for lc in attribute(w.events, log))
    unjudged = {lc.work.correlation for lc in launched}
    assert not unjudged & {k.correlation for k in lw.candidates(w.events, log)}
