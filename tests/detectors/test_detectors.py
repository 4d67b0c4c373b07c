"""Detectors (issue: detectors that name the bug): their logic, and their findings flowing
through a real worker into the records."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from gpucheck.controller.deaths import crash_hint
from gpucheck.detectors import CaseInfo, DeviceStateLeak, device_state, worker_detectors
from gpucheck.model import results

CASE = CaseInfo("cuda:1", "knn", "test_knn.py::test_x[cuda1]")


class FakeCuda:
    def __init__(self, devices):
        self.devices = list(devices)

    def current_device(self):
        return self.devices.pop(0)


@pytest.mark.parametrize(("seen", "leaks"), [((0, 0), False), ((0, 1), True), ((1, 0), True)])
def test_device_state_leak_compares_before_and_after(monkeypatch, seen, leaks):
    monkeypatch.setattr(device_state, "_cuda", lambda: FakeCuda(seen[:1]))
    d = DeviceStateLeak()
    d.case_started(CASE)
    monkeypatch.setattr(device_state, "_cuda", lambda: FakeCuda(seen[1:]))
    found = d.case_finished(CASE)
    assert bool(found) == leaks
    if leaks:
        f = found[0]
        assert (f.kind, f.severity, f.device, f.suite, f.case) == (
            "device-state-leak",
            "warning",
            "cuda:1",
            "knn",
            "test_knn.py::test_x[cuda1]",
        )
        assert f"from cuda:{seen[0]} to cuda:{seen[1]}" in f.message
        assert "OptionalCUDAGuard" in f.hint and "cudaSetDevice" in f.hint


def test_device_state_leak_is_silent_without_a_cuda_context(monkeypatch):
    monkeypatch.setattr(device_state, "_cuda", lambda: None)
    d = DeviceStateLeak()
    d.case_started(CASE)
    assert d.case_finished(CASE) == []


def test_every_worker_detector_has_a_name_and_the_hooks():
    for d in worker_detectors():
        assert d.name and callable(d.case_started) and callable(d.case_finished)
        assert d.run_finished([]) == []


SUITE = textwrap.dedent('''
    import os, pytest, torch

    class Leaky:
        """Stands in for an extension that calls cudaSetDevice and never restores it."""
        def __init__(self):
            self.device = 1
        def is_initialized(self):
            return True
        def current_device(self):
            return self.device

    @pytest.fixture
    def fake_cuda(monkeypatch, request):
        fake = Leaky()
        monkeypatch.setattr(torch.cuda, "is_initialized", fake.is_initialized)
        monkeypatch.setattr(torch.cuda, "current_device", fake.current_device)
        request.node.user_properties.append(("gpucheck_current_device", "cuda:1"))
        return fake

    def test_leaks(fake_cuda):
        fake_cuda.device = 0   # what cudaSetDevice(input.device().index()) does

    def test_restores(fake_cuda):
        fake_cuda.device = 0
        fake_cuda.device = 1

    def test_aborts(fake_cuda):
        os.write(2, b"terminate called after throwing an instance of 'thrust::system_error'\\n")
        os.abort()
''')


def test_findings_flow_into_records_and_crashes_keep_the_current_device(tmp_path):
    suite = tmp_path / "suites" / "leak"
    suite.mkdir(parents=True)
    (suite / "test_leak.py").write_text(SUITE)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "gpucheck.cli", "run", "--cpu-only", "--quiet", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the abort is an error
    recs = {r["case"]: r for r in results.cases(out / "results.jsonl")}
    leak = recs["test_leak.py::test_leaks"]
    assert leak["status"] == "passed"  # a warning does not fail the case
    assert [f["kind"] for f in leak["findings"]] == ["device-state-leak"]
    assert "from cuda:1 to cuda:0" in leak["findings"][0]["message"]
    assert recs["test_leak.py::test_restores"]["findings"] == []
    crash = recs["test_leak.py::test_aborts"]
    assert crash["status"] == "crashed" and crash["current_device"] == "cuda:1"
    assert "C++ exception escaped" in crash["findings"][-1]["hint"]


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


def test_sanitizer_passes_run_in_both_arrangements_on_two_gpus():
    from gpucheck.controller.config import plan_passes

    assert plan_passes(("blocking", "nvml", "sanitizer:memcheck"), devices=2) == [
        ("blocking+nvml", None),
        ("sanitizer:memcheck", "memcheck"),
        ("sanitizer:memcheck|target-current", "memcheck"),
    ]
    # one GPU: there is no other device to make current, so one arrangement is all there is
    assert plan_passes(("sanitizer:racecheck",), devices=1) == [
        ("sanitizer:racecheck", "racecheck")
    ]


def test_target_current_passes_tell_their_workers(tmp_path, monkeypatch, two_gpus, harness_specs):
    from gpucheck import cli
    from gpucheck.sanitizer import command as sanitizer_cmd

    monkeypatch.setattr(sanitizer_cmd, "find", lambda: tmp_path / "compute-sanitizer")
    suite = tmp_path / "mine"
    suite.mkdir()
    (suite / "test_x.py").write_text("def test_x():\n    pass\n")
    cli.main(
        [
            "run",
            "--suite",
            str(suite),
            "--mode",
            "sanitizer:memcheck",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    arrangement = {
        (s.label, s.mode): s.env["GPUCHECK_CURRENT"] for specs in harness_specs for s in specs
    }
    assert arrangement == {
        ("cuda:0", "sanitizer:memcheck"): "other",
        ("cuda:1", "sanitizer:memcheck"): "other",
        ("cuda:0", "sanitizer:memcheck|target-current"): "target",
        ("cuda:1", "sanitizer:memcheck|target-current"): "target",
    }


@pytest.mark.parametrize(
    ("inputs", "outputs", "before", "after", "kinds"),
    [
        (["cuda:1", "cuda:1"], ["cuda:1"], 1, 1, []),
        (["cuda:1"], ["cuda:0"], 1, 1, ["wrong-device"]),
        (["cuda:1", "cpu"], ["cuda:0"], 1, 1, []),  # mixed inputs: no single device to expect
        ([], ["cuda:0"], None, None, []),  # a factory op
        (["cuda:1"], ["cuda:1"], 1, 0, ["device-state-leak"]),
        (["cuda:1"], ["cuda:0"], 1, 0, ["wrong-device", "device-state-leak"]),
    ],
)
def test_op_events_rules(inputs, outputs, before, after, kinds):
    from gpucheck.detectors.op_device import op_events

    assert [k for k, _ in op_events("ext::op", inputs, outputs, before, after)] == kinds


OP_SUITE = textwrap.dedent("""
    import torch

    @torch.library.custom_op("gpucheck_demo::good", mutates_args=())
    def good(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @torch.library.custom_op("gpucheck_demo::alloc_elsewhere", mutates_args=())
    def alloc_elsewhere(x: torch.Tensor) -> torch.Tensor:
        # stands in for at::empty(..., torch::kCUDA) landing on the current device
        return torch.empty(x.shape, device="meta")

    def test_good():
        x = torch.rand(8)
        assert torch.equal(torch.ops.gpucheck_demo.good(x), x * 2)
        (x + 1).sum()   # torch's own ops are not watched

    def test_bad():
        x = torch.rand(8)
        for _ in range(3):
            y = torch.ops.gpucheck_demo.alloc_elsewhere(x)
        assert y.shape == x.shape
""")


def test_op_device_names_the_op_through_a_real_worker(tmp_path):
    suite = tmp_path / "suites" / "ops"
    suite.mkdir(parents=True)
    (suite / "test_ops.py").write_text(OP_SUITE)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "gpucheck.cli", "run", "--cpu-only", "--quiet", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = {r["case"]: r for r in results.cases(out / "results.jsonl")}
    assert recs["test_ops.py::test_good"]["findings"] == []
    bad = recs["test_ops.py::test_bad"]
    assert bad["status"] == "passed"  # the test itself cannot see it
    [f] = bad["findings"]
    assert (f["kind"], f["severity"], f["op"]) == (
        "wrong-device",
        "error",
        "gpucheck_demo::alloc_elsewhere",
    )
    assert "(3 calls)" in f["message"] and "inputs on cpu, output(s) on meta" in f["evidence"]
    assert "x.options()" in f["hint"]


def _run_with_detector(tmp_path, detector: str, test: str) -> tuple[dict, str]:
    """``gpucheck run --cpu-only`` over one test file with one more worker detector
    (``detector``: a class body's source, named ``Extra``); the one case record, and the
    run's output."""
    suite = tmp_path / "suites" / "d"
    suite.mkdir(parents=True)
    (suite / "conftest.py").write_text(
        textwrap.dedent(detector)
        + textwrap.dedent("""
        import gpucheck.worker.recorder as worker

        real = worker.worker_detectors
        worker.worker_detectors = lambda: [*real(), Extra()]
    """)
    )
    (suite / "test_d.py").write_text(textwrap.dedent(test))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "gpucheck.cli", "run", "--cpu-only", "--quiet", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    [rec] = results.cases(out / "results.jsonl")
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
    down = loop.finish(info, found, {}, lost_context=True)
    assert [f.kind for f in found] == ["mixed-devices"]
    assert down == ["wrong-stream", "numerics"]
    assert "stood down for this case (wrong-stream, numerics)" in stood_down_note(down)
    # with the context intact the same failure is a warning, and every finding counts
    found = []
    loop.start(info, found)
    assert loop.finish(info, found, {}) == []
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


def test_an_abort_hint_names_the_device_guard_only_with_another_device_current():
    stderr = "terminate called after throwing an instance of 'thrust::system_error'"
    assert "check the device guard" in crash_hint(-6, stderr, other_current=True)
    alone = crash_hint(-6, stderr, other_current=False)
    assert "not a device guard" in alone and "check the device guard" not in alone


def test_placeholder_outputs_and_arguments_are_no_device_for_the_output_rule():
    """fused-ssim's evaluation path returns empty CPU tensors for the buffers it does not
    compute, and the rasterizers take them for arguments not given: the output-device rule
    judges the tensors that hold data (before, every clean call was a wrong-device error)."""
    import torch

    from gpucheck.detectors.op_device import _tensor_devices, op_events

    image = torch.empty(3, 4, 4, device="meta")
    args = (image, torch.empty(0), torch.Tensor([]))
    out = (torch.empty(1, device="meta"), torch.empty(0), torch.empty(0), torch.empty(0))
    assert _tensor_devices(args) == ["meta"] and _tensor_devices(out) == ["meta"]
    assert op_events("ext.fusedssim", _tensor_devices(args), _tensor_devices(out), 0, 0) == []
    # an output with data elsewhere is still named, placeholders among the inputs or not
    moved = (torch.empty(3, 4, 4),)
    assert [
        k for k, _ in op_events("ext.render", _tensor_devices(args), _tensor_devices(moved), 0, 0)
    ] == ["wrong-device"]


def test_a_size_torch_does_not_know_yet_is_not_asked_about():
    """Under opcheck a fake tensor's size can be a data-dependent symbol: deciding whether it
    is a placeholder must not make torch guard on it (a detector-error on every opcheck case
    of the splat suite, 2x H200)."""
    from gpucheck.detectors.op_watch import placeholder

    class Symbolic:
        def __eq__(self, other):
            raise RuntimeError("GuardOnDataDependentSymNode: Could not guard on Eq(u0, 0)")

        __hash__ = object.__hash__

    class Fake:
        def numel(self):
            return Symbolic()

    assert placeholder(Fake()) is False
