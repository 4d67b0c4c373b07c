"""device-state-leak: the current device compared before and after a case, and its finding
(and a crash's current device) flowing through a real worker into the records."""

from __future__ import annotations

import contextlib
import textwrap

import pytest
from clirun import run_suite

from gpucheck.detectors import CaseInfo, DeviceStateLeak, PendingError, device_state

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
    proc, recs = run_suite(tmp_path, "leak", {"test_leak.py": SUITE})
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the abort is an error
    leak = recs["test_leak.py::test_leaks"]
    assert leak["status"] == "passed"  # a warning does not fail the case
    assert [f["kind"] for f in leak["findings"]] == ["device-state-leak"]
    assert "from cuda:1 to cuda:0" in leak["findings"][0]["message"]
    assert recs["test_leak.py::test_restores"]["findings"] == []
    crash = recs["test_leak.py::test_aborts"]
    assert crash["status"] == "crashed" and crash["current_device"] == "cuda:1"
    assert "C++ exception escaped" in crash["findings"][-1]["hint"]


class Runtime:
    """A CUDA runtime's last error, as torch meets it: a launch raises what is pending and
    clears it (``C10_CUDA_KERNEL_LAUNCH_CHECK`` reads ``cudaGetLastError``); a lost context
    raises every time."""

    def __init__(self, pending=None, sticky=False, current=1):
        self.pending, self.sticky, self.current = pending, sticky, current
        self.launched_on = []

    def is_initialized(self):
        return True

    def current_device(self):
        return self.current

    @contextlib.contextmanager
    def device(self, index):
        before, self.current = self.current, index
        try:
            yield
        finally:
            self.current = before

    def _sleep(self, cycles):
        self.launched_on.append(self.current)
        error, self.pending = self.pending, None if not self.sticky else self.pending
        if error is not None:
            raise RuntimeError(error)


#: torch's messages as raised on an H100 (torch 2.11): every one ends with the DSA hint
TORCH_TAIL = (
    "CUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\nFor debugging consider passing "
    "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
INVALID = (
    "CUDA error: invalid argument\nSearch for `cudaErrorInvalidValue' in https://docs.nvidia.com/"
    "cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.\n" + TORCH_TAIL
)
ILLEGAL = "CUDA error: an illegal memory access was encountered\n" + TORCH_TAIL


def pending_after(monkeypatch, runtime, body=lambda rt: None):
    monkeypatch.setattr(device_state, "_cuda", lambda: runtime)
    d = PendingError()
    d.case_started(CASE)
    body(runtime)
    return d.case_finished(CASE)


def test_pending_error_is_read_cleared_and_reported(monkeypatch):
    rt = Runtime()

    def body(rt):  # the extension's check throws on cudaMemsetAsync's result, error unread
        rt.pending, rt.current = INVALID, 0

    (f,) = pending_after(monkeypatch, rt, body)
    assert (f.kind, f.severity, f.device, f.case) == ("cuda-error", "error", "cuda:1", CASE.case)
    assert "left a CUDA error pending (CUDA error: invalid argument, cudaErrorInvalidValue)" in (
        f.message
    )
    assert "cuda:1" in f.evidence and "cudaGetLastError" in f.hint
    assert rt.pending is None  # read: the next case starts clean
    assert rt.launched_on == [1]  # on the device current before the body (it has a context)
    assert rt.current == 0  # and the case's own current device is left as it was


def test_no_pending_error_no_finding(monkeypatch):
    rt = Runtime()
    assert pending_after(monkeypatch, rt) == []
    assert rt.launched_on == [1]


def test_a_lost_context_is_not_a_pending_error(monkeypatch):
    """A sticky error stays whatever reads it: the case's own record reports it."""
    assert pending_after(monkeypatch, Runtime(pending=ILLEGAL, sticky=True)) == []


def test_no_probe_without_cuda_initialized_before_the_body(monkeypatch):
    monkeypatch.setattr(device_state, "_cuda", lambda: None)
    d = PendingError()
    d.case_started(CASE)
    rt = Runtime(pending=INVALID)
    monkeypatch.setattr(device_state, "_cuda", lambda: rt)
    assert d.case_finished(CASE) == []
    assert rt.launched_on == []  # no launch that could make a context


PENDING_SUITE = textwrap.dedent('''
    import contextlib, pytest, torch

    class Runtime:
        """torch.cuda as a test sees it, with the runtime's last error (see the test module)."""
        pending = None
        def is_initialized(self):
            return True
        def current_device(self):
            return 0
        @contextlib.contextmanager
        def device(self, index):
            yield
        def _sleep(self, cycles):
            error, Runtime.pending = Runtime.pending, None
            if error:
                raise RuntimeError(error)

    @pytest.fixture
    def cuda(monkeypatch):
        rt = Runtime()
        for name in ("is_initialized", "current_device", "device", "_sleep"):
            monkeypatch.setattr(torch.cuda, name, getattr(rt, name))
        return rt

    def test_a_check_that_throws(cuda):
        Runtime.pending = "CUDA error: invalid argument"
        raise RuntimeError("extension: ranges: invalid argument")

    def test_next(cuda):
        cuda._sleep(0)  # what the next case's first launch meets

    def test_an_unchecked_launch(cuda):
        Runtime.pending = "CUDA error: too many resources requested for launch"
''')


def test_a_pending_error_stays_with_the_case_that_left_it(tmp_path):
    """Through a real worker: the case that left the error gets the finding, the next case
    does not fail with it, and a passing case that left one is no longer clean."""
    proc, recs = run_suite(tmp_path, "pending", {"test_pending.py": PENDING_SUITE})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    threw = recs["test_pending.py::test_a_check_that_throws"]
    assert threw["status"] == "failed"
    assert "cuda-error" in [f["kind"] for f in threw["findings"]]
    assert recs["test_pending.py::test_next"]["status"] == "passed"
    assert recs["test_pending.py::test_next"]["findings"] == []
    unchecked = recs["test_pending.py::test_an_unchecked_launch"]
    (f,) = [f for f in unchecked["findings"] if f["kind"] == "cuda-error"]
    assert f["severity"] == "error" and "too many resources" in f["message"]


def test_a_probe_that_cannot_launch_is_no_finding(monkeypatch):
    """No CUDA error in what the probe raised (a fake torch.cuda, no CUDA build): nothing."""
    rt = Runtime(pending="Torch not compiled with CUDA enabled")
    assert pending_after(monkeypatch, rt) == []
