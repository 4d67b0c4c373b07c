"""stray-context, on the case records of a self-test run recorded on an H200
(tests/fixtures/run_h200_selftest), moved into a target-current pass and given the NVML
memory a worker would show on a second GPU."""

from __future__ import annotations

from pathlib import Path

from gpucheck.detectors import StrayContext
from gpucheck.detectors.stray_context import stray
from gpucheck.model.runlog import RunLog

RUN = Path(__file__).parents[1] / "fixtures" / "run_h200_selftest" / "results.jsonl"
OTHER = "GPU-11111111-2222-3333-4444-555555555555"


def target_current_records():
    recs = [r for r in RunLog.read(RUN).cases if r.mode == "blocking+nvml"]
    for r in recs:
        r.mode += "|rerun:target-current"
    return recs


def test_the_recorded_run_has_no_stray_context():
    recs = target_current_records()
    assert recs and any(r.memory.nvml_peak_other_devices is not None for r in recs)
    assert stray(recs) == []
    # and the other-device-current passes are never judged (a context there is by design)
    plain = RunLog.read(RUN).cases
    for r in plain:
        r.memory.nvml_peak_other_devices = {OTHER: 500 << 20}
    assert stray(plain) == []


def test_first_case_that_touches_another_gpu_is_named_once():
    recs = target_current_records()
    for r in recs[2:]:
        r.memory.nvml_peak_other_devices = {OTHER: 504 << 20}
    [f] = StrayContext({OTHER: "cuda:1"}).run_finished(recs)
    assert (f.kind, f.severity, f.case, f.device) == (
        "stray-context",
        "warning",
        recs[2].case,
        recs[2].device,
    )
    assert "context on cuda:1" in f.message and "cuda:1 (504 MiB)" in f.evidence
    assert "OptionalCUDAGuard" in f.hint


def test_a_fresh_worker_that_touches_it_again_is_named_again():
    recs = target_current_records()
    recs[1].memory.nvml_peak_other_devices = {OTHER: 1 << 20}
    recs[3].memory.nvml_peak_other_devices = {OTHER: 1 << 20}  # after a restart (none at 2)
    assert [f.case for f in stray(recs)] == [recs[1].case, recs[3].case]
