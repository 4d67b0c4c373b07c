"""gpucheck.testing.assert_close: the measured errors, and how they reach the case record and
a numerics finding through a real worker."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from clirun import run_suite

from gpucheck.testing import assert_close, measure


def test_measures_the_worst_element():
    want = torch.linspace(1, 2, 12, dtype=torch.float64).reshape(3, 4)
    got = want.float().clone()
    got[2, 1] += 0.01
    m = measure(got, want, rtol=1e-3, atol=0.0, what="demo")
    assert not m.ok and m.mismatched == 1 and m.total == 12
    assert m.worst_index == [2, 1]
    assert m.max_abs == pytest.approx(0.01, rel=1e-4)
    assert m.max_rel == pytest.approx(0.01 / float(want[2, 1]), rel=1e-4)
    assert "1 of 12 elements out of tolerance" in m.message() and "(2, 1)" in m.message()
    # the same comparison torch makes agrees on the verdict
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=0.0)


def test_nan_inf_and_shape_rules():
    want = torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.float64)
    assert measure(want.float(), want, rtol=0, atol=0).ok  # NaN where NaN, inf where inf
    got = torch.tensor([float("nan"), float("nan"), float("inf")])
    m = measure(got, want, rtol=0.1, atol=0.1)
    assert not m.ok and m.nan_mismatch == 1 and "NaN where" in m.message()
    with pytest.raises(AssertionError, match="shape"):
        assert_close(torch.zeros(2), torch.zeros(3), rtol=0, atol=0)


SUITE = textwrap.dedent("""
    import torch
    from gpucheck.testing import assert_close

    def test_close():
        x = torch.rand(100, dtype=torch.float64)
        assert_close(x.float(), x, rtol=1e-6, atol=0, what="rounding")

    def test_off():
        x = torch.rand(100, dtype=torch.float64) + 1
        y = x.clone()
        y[7] *= 1.5
        assert_close(y, x, rtol=1e-6, atol=0, what="kernel vs reference")
""")


def test_a_worker_reports_the_measurement(tmp_path):
    proc, by_id = run_suite(tmp_path, "num", {"test_num.py": SUITE})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = {case.rsplit("::", 1)[-1]: r for case, r in by_id.items()}
    close = recs["test_close"]
    assert close["status"] == "passed" and close["findings"] == []
    [m] = close["numerics"]
    assert m["ok"] and m["what"] == "rounding" and 0 < m["max_rel"] <= 1e-6
    off = recs["test_off"]
    assert off["status"] == "failed"
    num = [f for f in off["findings"] if f["kind"] == "numerics"]
    assert len(num) == 1 and num[0]["severity"] == "error"
    assert "1 of 100 elements out of tolerance" in num[0]["message"]
    ev = json.loads(num[0]["evidence"])
    assert ev["worst_index"] == [7] and ev["max_rel"] == pytest.approx(0.5)


def test_dtype_coverage():
    from gpucheck.testing import check_dtypes

    def make(dtype):
        return (torch.rand(8).to(dtype),)

    def strict(x):
        if x.dtype != torch.float32:
            raise TypeError(f"op: x must be float32, got {x.dtype}")
        return x * 2

    got = check_dtypes(strict, make, ("float32",), what="strict")
    assert [(o.dtype, o.outcome) for o in got] == [
        ("float16", "rejected"),
        ("bfloat16", "rejected"),
        ("float32", "ran"),
        ("float64", "rejected"),
    ]

    def lax(x):  # silently computes any dtype
        return x * 2

    with pytest.raises(AssertionError, match="float64: accepted"):
        check_dtypes(lax, make, ("float32",), what="lax")

    def vague(x):
        if x.dtype != torch.float32:
            raise RuntimeError("unsupported input")
        return x

    with pytest.raises(AssertionError, match="error does not name float16"):
        check_dtypes(vague, make, ("float32",), what="vague")


def test_a_broken_dtype_coverage_is_its_own_finding_not_a_reference_mismatch():
    from gpucheck.detectors import CaseInfo
    from gpucheck.detectors.numerics import Numerics
    from gpucheck.testing import check_dtypes

    d = Numerics()
    case = CaseInfo("cpu", "mine", "test_f.py::test_dtypes")
    d.case_started(case)
    with pytest.raises(AssertionError):
        check_dtypes(
            lambda x: x * 2, lambda dt: (torch.rand(8).to(dt),), ("float32",), what="ext.f"
        )
    (f,) = d.case_finished(case)
    assert f.kind == "numerics" and f.message.startswith(
        "ext.f: dtype coverage broken for float16: accepted (accepted float16 although"
    )
    assert "reject every other one" in f.hint
