"""double-activation: the detector reading the checkpoint round trips of a case, and the
self-test's double-activation row run on CPU."""

from __future__ import annotations

from pathlib import Path

from clirun import gpucheck

from gpucheck.checkpoints.detectors import DoubleActivation
from gpucheck.detectors import CaseInfo

CASE = CaseInfo("cuda:0", "s", "test_x.py::test_x[cuda0]")


def test_double_activation_detector_reads_round_trips():
    from gpucheck.checkpoints import roundtrip

    d = DoubleActivation()
    d.case_started(CASE)
    roundtrip.OUTCOMES.append(
        roundtrip.RoundtripReport(
            ok=False,
            fields={"log_scales": "came back as exp(saved)"},
            activated=["log_scales"],
            message="activation applied twice: log_scales came back activated; more",
        )
    )
    [f] = d.case_finished(CASE)
    assert (f.kind, f.severity) == ("double-activation", "error") and roundtrip.OUTCOMES == []
    assert f.message == "activation applied twice: log_scales came back activated"


def test_selftest_double_activation_row_on_cpu(tmp_path):
    """The self-test's checkpoint rows run without a GPU: the activated writer is found, its
    clean twin draws no finding."""
    from gpucheck.selftest import matrix, read_run

    out = tmp_path / "out"
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--quiet",
        "--suite",
        "selftest",
        "--out",
        str(out),
        "--",
        "-k",
        "roundtrip or double_activation",
        cwd=Path(__file__).parents[2],
        timeout=300,
    )
    rows, false = matrix(*read_run(out))
    row = next(r for r in rows if r.defect.kind == "double-activation")
    assert row.status == "found", proc.stdout + proc.stderr
    assert false == [] and {r.status for r in rows if r is not row} == {"not run"}
