"""A case's outcome from pytest's own reports of its phases (gpucheck.worker.outcome), and its
findings reconciled with those of its detectors."""

from __future__ import annotations

import pytest

from gpucheck.model.contract import CURRENT_DEVICE_PROPERTY
from gpucheck.model.results import CaseInfo, Finding
from gpucheck.worker.outcome import lost_context, outcome, reconcile

INFO = CaseInfo("cuda:1", "s", "test_o.py::test_x")
CUDA_ERROR = "RuntimeError: CUDA error: an illegal memory access was encountered"


def reports_of(pytester: pytest.Pytester, body: str) -> list[pytest.TestReport]:
    """The reports pytest makes for the one test of ``body``, setup to teardown."""
    pytester.makepyfile(test_o=body)
    recorded = pytester.inline_run("-p", "no:cacheprovider", "-p", "no:torch-gpucheck")
    return [r for r in recorded.getreports("pytest_runtest_logreport") if r.when]


def test_a_passing_case_passed(pytester: pytest.Pytester) -> None:
    out = outcome(reports_of(pytester, "def test_x():\n    pass\n"), INFO, None, None)
    assert (out.status, out.reason, out.findings, out.current) == ("passed", None, [], None)


def test_a_skip_and_an_expected_failure_say_why(pytester: pytest.Pytester) -> None:
    skip = "import pytest\ndef test_x():\n    pytest.skip('no GPU here')\n"
    assert outcome(reports_of(pytester, skip), INFO, None, None).reason == "no GPU here"
    xfail = "import pytest\n@pytest.mark.xfail(reason='known')\ndef test_x():\n    assert 0\n"
    out = outcome(reports_of(pytester, xfail), INFO, None, None)
    assert (out.status, out.reason) == ("skipped", "expected failure: known")


def test_a_failed_call_names_the_op_it_came_from(pytester: pytest.Pytester) -> None:
    """A CUDA error: the last op called (raised in or after it), its own device current so
    not a device guard; an extension's own error: the op that raised it."""
    cuda = f"def test_x():\n    raise RuntimeError({CUDA_ERROR.split(': ', 1)[1]!r})\n"
    out = outcome(reports_of(pytester, cuda), INFO, "ns::last", "ns::raised")
    [f] = out.findings
    assert (out.status, f.kind, f.op, f.device, f.case) == (
        "failed",
        "cuda-error",
        "ns::last",
        "cuda:1",
        INFO.case,
    )
    assert out.call_failure is f and out.reason == f.message
    assert f.hint and "not a device guard" in f.hint
    own = "def test_x():\n    raise ValueError('means must be [N, 3]')\n"
    [g] = outcome(reports_of(pytester, own), INFO, "ns::last", "ns::raised").findings
    assert (g.kind, g.op, g.hint) == ("test-failure", "ns::raised", None)


def test_another_device_current_points_at_a_device_guard(pytester: pytest.Pytester) -> None:
    body = (
        "def test_x(record_property):\n"
        f"    record_property({CURRENT_DEVICE_PROPERTY!r}, 'cuda:0')\n"
        f"    raise RuntimeError({CUDA_ERROR.split(': ', 1)[1]!r})\n"
    )
    out = outcome(reports_of(pytester, body), INFO, None, None)
    assert out.current == "cuda:0" and out.other_current(INFO.device)
    assert "missing device guard" in (out.findings[0].hint or "")


def test_a_failing_fixture_is_an_error_of_its_phase(pytester: pytest.Pytester) -> None:
    body = (
        "import pytest\n@pytest.fixture\ndef broken():\n    raise OSError('no scratch')\n"
        "def test_x(broken):\n    pass\n"
    )
    out = outcome(reports_of(pytester, body), INFO, None, None)
    assert out.status == "error" and out.call_failure is None
    assert out.findings[0].message.endswith("(in setup)")


def test_a_teardown_that_met_the_lost_context_is_not_another_failure(
    pytester: pytest.Pytester,
) -> None:
    body = (
        "import pytest\n@pytest.fixture\ndef dev():\n    yield\n"
        f"    raise RuntimeError({CUDA_ERROR.split(': ', 1)[1]!r})\n"
        "def test_x(dev):\n"
        f"    raise RuntimeError({CUDA_ERROR.split(': ', 1)[1]!r})\n"
    )
    reports = reports_of(pytester, body)
    assert lost_context(reports)
    out = outcome(reports, INFO, None, None)
    assert [f.kind for f in out.findings] == ["cuda-error"] and out.status == "failed"


def test_a_sanitizer_error_fails_a_case_that_passed() -> None:
    out = outcome([], INFO, None, None)
    out.fail([INFO.finding("sanitizer", "warning", "a hazard")], "compute-sanitizer")
    assert out.status == "passed"
    out.fail([INFO.finding("sanitizer", "error", "invalid read")], "compute-sanitizer")
    assert (out.status, out.reason) == ("failed", "compute-sanitizer: invalid read")


def test_reconcile_keeps_one_finding_of_each_and_says_what_explains_the_error(
    pytester: pytest.Pytester,
) -> None:
    body = "def test_x():\n    raise AssertionError('ns::op: result off by 3 ulp at [2]')\n"
    said = INFO.finding("numerics", "error", "ns::op: result off by 3 ulp at [2]")
    out = outcome(reports_of(pytester, body), INFO, None, None)
    assert reconcile(out, [said], []) == [said]  # the detector's finding stands for it
    assert said.evidence  # and takes the failure's evidence
    cuda = f"def test_x():\n    raise RuntimeError({CUDA_ERROR.split(': ', 1)[1]!r})\n"
    out = outcome(reports_of(pytester, cuda), INFO, "ns::op", None)
    mixed = INFO.finding("mixed-devices", "error", "ns::op got cpu and cuda:1", hint="move it")
    found = reconcile(out, [mixed], ["wrong-stream"])
    assert found == [out.call_failure, mixed]
    failure = found[0]
    assert isinstance(failure, Finding) and "mixed-devices finding" in (failure.hint or "")
    assert (failure.evidence or "").startswith("gpucheck: the CUDA context was lost")
