"""wrong-stream detector: its logic on profiler events recorded on a GPU
(tests/fixtures/profiler/, see the README there), and its guards without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucheck.detectors import CaseInfo, WrongStreamDetector, worker_detectors, wrong_stream
from gpucheck.detectors.wrong_stream import findings, launches

FIXTURES = Path(__file__).parent / "fixtures" / "profiler"
CASE = CaseInfo("cuda:0", "selftest", "test_defect_stream.py::test_legacy_stream_ssim[cuda0]")


def events(name: str) -> list[dict]:
    return json.loads((FIXTURES / f"{name}.json").read_text())["events"]


def check(evs: list[dict]) -> list:
    return findings(CASE, wrong_stream.wrong_stream(launches(evs)))


def test_marker_gives_the_current_stream():
    work = launches(events("clean_ssim"))
    markers = [w for w in work if w.marker]
    assert markers and {(w.op, w.stream) for w in markers} == {("aten::fill_", markers[0].stream)}
    ssim = [w for w in work if w.op and w.op.startswith("gpucheck::")]
    assert {w.op for w in ssim} == {"gpucheck::ssim_forward", "gpucheck::ssim_backward"}
    assert {w.stream for w in ssim} == {markers[0].stream}  # the poisoned stream


def test_clean_ssim_has_no_finding():
    assert check(events("clean_ssim")) == []


def test_legacy_stream_ssim_names_op_and_kernel():
    found = check(events("legacy_stream_ssim"))
    ops = {f.op for f in found}
    assert ops == {"gpucheck_defect_legacy_stream::ssim_forward",
                   "gpucheck_defect_legacy_stream::ssim_backward"}
    marker = next(w for w in launches(events("legacy_stream_ssim")) if w.marker)
    for f in found:
        assert (f.kind, f.severity, f.device, f.suite, f.case) == (
            "wrong-stream", "error", CASE.device, CASE.suite, CASE.case)
        assert f.kernel and "ssim" in f.kernel and f.kernel in f.message
        assert f"the current stream is {marker.stream}" in (f.evidence or "")
        assert "getCurrentCUDAStream()" in (f.hint or "")


def test_torch_ops_on_other_streams_are_fine():
    """aten ops on stream 0 and on a private stream, and an extension op on that private
    stream (made current by the test itself): no finding."""
    evs = events("torch_streams")
    work = launches(evs)
    current = next(w.stream for w in work if w.marker)
    assert len({w.stream for w in work}) == 3 and current in {w.stream for w in work}
    assert check(evs) == []


def test_knn_on_the_tests_own_stream_is_fine():
    evs = events("knn_side_stream")
    assert any(w.op == "gpucheck::knn_mean_sq_dist" for w in launches(evs))
    assert check(evs) == []


def test_extension_kernel_on_a_stream_torch_never_used_is_a_finding():
    """The private stream of torch_streams, minus the torch ops on it: the extension op alone
    on a stream that was never current."""
    evs = events("torch_streams")
    work = launches(evs)
    current = next(w.stream for w in work if w.marker)
    private = next(w.stream for w in work if w.op and w.op.startswith("gpucheck::"))
    assert private != current
    ops = {e["id"]: e["name"] for e in evs if e["type"] in ("cpu_op", "user_annotation")}
    kept = [e for e in evs if not (e["type"] in wrong_stream.GPU_WORK and e["stream"] == private
                                   and ops.get(e["linked"], "").startswith("aten::"))]
    found = check(kept)
    assert found and {f.op for f in found} == {"gpucheck::ssim_forward"}
    assert f"ran on {private};" in (found[0].evidence or "")


def test_no_marker_no_judgement():
    """Without the marker (e.g. the marker's device was not profiled), the current stream
    of that device is unknown: no finding rather than a guess."""
    evs = [e for e in events("legacy_stream_ssim") if e["name"] != wrong_stream.MARKER]
    assert check(evs) == []


def test_several_devices_each_judged_by_its_own_current_stream():
    """The same recorded work seen on cuda:1 too: each device is judged by its own marker;
    a device without one is not judged."""
    base = events("legacy_stream_ssim")
    shift = 1 + max(e["id"] for e in base)
    copy = [dict(e, id=e["id"] + shift if e["id"] else 0,
                 linked=e["linked"] + shift if e["linked"] else 0,
                 **({"device": 1} if "device" in e else {})) for e in base]
    both = check(base + copy)
    assert {f.evidence.split(":")[1].split(" ")[0] for f in both} == {"0", "1"}
    assert len(both) == 2 * len(check(base))
    # cuda:1 clean on its current stream, cuda:0 defect: only cuda:0 is reported
    clean1 = [dict(e, **({"device": 1} if "device" in e else {})) for e in events("clean_ssim")]
    found = check(base + clean1)
    assert found and all("cuda:0" in f.message for f in found)


def test_no_cuda_context_no_profiling(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    det = WrongStreamDetector()
    det.case_started(CASE)
    assert not det.active and det.case_finished(CASE) == []


def test_failing_marker_never_fails_the_case(monkeypatch):
    """A CUDA context that is claimed but unusable (here: a CPU build of torch): no profiling,
    no exception, the profiler is off again."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a torch without CUDA")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    det = WrongStreamDetector()
    det.case_started(CASE)
    assert not det.active and not torch._C._autograd._profiler_enabled()
    assert det.case_finished(CASE) == []


def test_registered_and_can_be_disabled(monkeypatch):
    assert "wrong-stream" in [d.name for d in worker_detectors()]
    monkeypatch.setenv("GPUCHECK_DISABLE_DETECTORS", "wrong-stream")
    assert "wrong-stream" not in [d.name for d in worker_detectors()]


def test_plain_events_of_a_real_profile():
    """plain_events on a real kineto result (CPU activity, so it runs without a GPU): host
    ops and the marker annotation come through; with a marked device and no GPU work there
    is nothing to judge, so the fast path returns nothing."""
    import torch
    from torch._C._profiler import ProfilerActivity

    det = WrongStreamDetector()
    config, _ = det._config(torch)
    activities = {ProfilerActivity.CPU}
    from torch.autograd.profiler import _disable_profiler, _enable_profiler, _prepare_profiler

    _prepare_profiler(config, activities)
    _enable_profiler(config, activities)
    with torch.autograd.profiler.record_function(wrong_stream.MARKER):
        torch.zeros(4).add_(1)
    result = _disable_profiler()
    rows = wrong_stream.plain_events(result)
    names = {r["name"]: r["type"] for r in rows}
    assert names[wrong_stream.MARKER] == "user_annotation" and names["aten::add_"] == "cpu_op"
    assert all({"name", "type", "thread", "start_ns", "end_ns", "id", "linked"} <= set(r)
               for r in rows)
    assert launches(rows) == [] and wrong_stream.plain_events(result, marked=[0]) == []


def test_poisoned_stream_keeps_the_poisoned_device(monkeypatch):
    """torch.cuda.set_stream also makes the stream's device current; the fixture's stream
    switch must leave the (poisoned) current device alone, on entry and on exit."""
    import torch

    from gpucheck.runner import poison

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
