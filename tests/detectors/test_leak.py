"""leak: the judgement over repeated runs of a case, the detector without CUDA, and the repeat
marker in a real worker."""

from __future__ import annotations

import textwrap

from clirun import gpucheck
from memkit import MiB

from gpucheck.detectors import CaseInfo, Leak, worker_detectors
from gpucheck.detectors.leak import judge
from gpucheck.model import results

CASE = CaseInfo("cuda:0", "s", "test_x.py::test_x[cuda0]")


def test_leak_judgement():
    flat = [1000] * 5
    raw = [600 * MiB + k * 16 * MiB for k in range(5)]
    [f] = judge(flat, raw, CASE, "NVML")
    assert (
        f.kind == "leak"
        and "outside PyTorch's allocator" in f.message
        and "16.0 MiB per run" in f.message
    )
    [t] = judge([k * 4 * MiB for k in range(5)], [600 * MiB] * 5, CASE, "NVML")
    assert "PyTorch memory grows" in t.message
    # lazy initialization in the second run only: a step, not a leak
    assert (
        judge(
            [0, 2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB],
            [600 * MiB, 640 * MiB] + [640 * MiB] * 3,
            CASE,
            "NVML",
        )
        == []
    )


def test_leak_detector_measures_nothing_without_cuda():
    d = Leak()
    d.case_started(CASE)
    d.repeat(lambda: None, 3)
    assert d.case_finished(CASE) == []
    assert {"leak", "double-activation"} <= {x.name for x in worker_detectors()}


def test_repeat_marker_in_a_real_worker(tmp_path):
    """The worker runs a marked body n times (fixtures once); a bad marker is a finding."""
    suite = tmp_path / "suites" / "rep"
    suite.mkdir(parents=True)
    (suite / "test_r.py").write_text(
        textwrap.dedent("""
        import pytest
        CALLS = []

        @pytest.fixture(scope="module")
        def made():
            CALLS.append("fixture")
            return CALLS

        @pytest.mark.gpucheck_repeat(4)
        def test_counted(made):
            made.append("body")

        def test_after(made):
            assert made.count("body") == 4 and made.count("fixture") == 1

        @pytest.mark.gpucheck_repeat(3)
        def test_fails_second_time(made):
            assert made.count("again") == 0 or False
            made.append("again")

        @pytest.mark.gpucheck_repeat("many")
        def test_bad_marker():
            pass
    """)
    )
    out = tmp_path / "out"
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--quiet",
        "--suite",
        str(suite),
        "--out",
        str(out),
        cwd=tmp_path,
        timeout=180,
    )
    recs = {r["case"].split("::")[1]: r for r in results.cases(out / "results.jsonl")}
    assert recs["test_after"]["status"] == "passed", proc.stdout + proc.stderr
    again = recs["test_fails_second_time"]["findings"]
    assert [(f["kind"], f["severity"]) for f in again] == [("test-failure", "error")]
    assert "failed when repeated: run 2 of 3" in again[0]["message"]
    bad = recs["test_bad_marker"]["findings"]
    assert [f["kind"] for f in bad] == ["detector-error"] and "n >= 2" in bad[0]["message"]
