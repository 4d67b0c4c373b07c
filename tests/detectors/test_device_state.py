"""device-state-leak: the current device compared before and after a case, and its finding
(and a crash's current device) flowing through a real worker into the records."""

from __future__ import annotations

import textwrap

import pytest
from clirun import gpucheck

from gpucheck.detectors import CaseInfo, DeviceStateLeak, device_state
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
    proc = gpucheck("run", "--cpu-only", "--quiet", "--out", str(out), cwd=tmp_path, timeout=180)
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
