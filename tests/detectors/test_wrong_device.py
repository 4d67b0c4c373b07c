"""wrong-device by differential re-run: the comparison on real records, and the whole loop
(a case that fails only with another device current, re-run with its target current) through
real workers on CPU."""

from __future__ import annotations

import copy
import json
import textwrap
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from conftest import two_gpu_inventory

from gpucheck import cli
from gpucheck.controller import config, pipeline
from gpucheck.detectors.wrong_device import WrongDevice, diagnose, extension_function, suspects
from gpucheck.model import results
from gpucheck.model.results import CaseRecord
from gpucheck.model.runlog import RunLog

FIXTURE = Path(__file__).parents[1] / "fixtures" / "run_h200_selftest" / "results.jsonl"


def _recorded_overrun() -> CaseRecord:
    """The real memcheck record of the self-test's out-of-bounds kernel (one H200)."""
    return next(
        r
        for r in RunLog.read(FIXTURE).cases
        if r.case.endswith("test_overrun[cuda0]") and r.mode == "sanitizer:memcheck"
    )


def _as_seen_with(
    record: CaseRecord, current: str | None, mode: str, status: str | None = None
) -> CaseRecord:
    r = replace(copy.deepcopy(record), current_device=current, mode=mode)
    if status is not None:
        r.status, r.findings = status, []
    return r


def _with_findings(*findings: dict) -> CaseRecord:
    found = CaseRecord.from_json(
        {
            "device": "cuda:0",
            "suite": "s",
            "case": "t.py::x",
            "status": "failed",
            "findings": list(findings),
        }
    )
    assert found is not None
    return found


def test_a_case_that_passes_with_its_target_current_is_a_wrong_device_finding():
    wrong = _as_seen_with(_recorded_overrun(), "cuda:1", "sanitizer:memcheck")
    twin = _as_seen_with(wrong, "cuda:0", "sanitizer:memcheck|target-current", "passed")
    found = WrongDevice().run_finished([wrong, twin])
    assert len(found) == 1
    f = found[0]
    assert (f.kind, f.severity, f.device, f.suite, f.case) == (
        "wrong-device",
        "error",
        "cuda:0",
        "selftest",
        "test_selftest.py::test_overrun[cuda0]",
    )
    # the extension function from the sanitizer's host frames, the kernel from its record
    assert f.op == "add_one_overrun(at::Tensor const&)" and f.kernel == "<unnamed>::add_one"
    assert "with cuda:1 current (sanitizer:memcheck): crashed" in f.evidence
    assert "with cuda:0 current" in f.evidence and "passed" in f.evidence
    assert "OptionalCUDAGuard guard(device_of(x))" in f.hint and "add_one_overrun" in f.hint


def test_a_case_that_fails_with_its_target_current_too_is_not_a_device_bug():
    wrong = _as_seen_with(_recorded_overrun(), "cuda:1", "sanitizer:memcheck")
    twin = _as_seen_with(_recorded_overrun(), "cuda:0", "sanitizer:memcheck|target-current")
    assert WrongDevice().run_finished([wrong, twin]) == []


def test_only_cases_run_with_another_device_current_are_suspects():
    rec = _recorded_overrun()
    assert suspects([_as_seen_with(rec, None, "m")], "m") == []  # one GPU
    assert suspects([_as_seen_with(rec, "cuda:0", "m")], "m") == []  # its own device
    assert suspects([_as_seen_with(rec, "cuda:1", "m", "passed")], "m") == []
    assert len(suspects([_as_seen_with(rec, "cuda:1", "m")], "m")) == 1
    assert diagnose([_as_seen_with(rec, "cuda:1", "m")], []) == []  # never re-run


def test_extension_function_skips_runtime_and_anonymous_frames():
    fn, _ = extension_function(_recorded_overrun())
    assert fn == "add_one_overrun(at::Tensor const&)"
    assert extension_function(_with_findings({"evidence": "no frames", "kernel": "k"})) == (
        None,
        "k",
    )
    # without host frames (a plain pass), the op the worker saw the case call last
    assert extension_function(
        _with_findings(
            {"kind": "cuda-error", "evidence": "Traceback", "op": "gpucheck::ssim_forward"}
        )
    ) == ("gpucheck::ssim_forward", None)


SUITE = textwrap.dedent('''
    import os, pytest

    @pytest.fixture
    def arranged(request):
        """Stands in for gpu_device on a machine without GPUs: cuda:1 is current unless the
        harness asks for the target (cuda:0) to be current."""
        target = os.environ.get("GPUCHECK_CURRENT") == "target"
        request.node.user_properties.append(
            ("gpucheck_current_device", "cpu" if target else "cuda:1"))
        return target

    def test_ok(arranged):
        pass

    def test_no_guard(arranged):
        # what an unguarded extension does: fine only when its inputs' device is current
        assert arranged, "illegal memory access"

    def test_real_bug(arranged):
        assert 1 == 2

    def test_flaky(arranged):
        # fails the first time only (a random input would): the re-runs both pass
        import pathlib
        mark = pathlib.Path(__file__).parent / "flaky-mark"
        first = not mark.exists()
        mark.touch()
        assert not first, "unlucky seed"
''')


def test_the_differential_rerun_runs_only_the_suspects_and_names_the_device_bug(
    tmp_path, monkeypatch, capsys
):
    suite = tmp_path / "suites" / "arr"
    suite.mkdir(parents=True)
    (suite / "test_arr.py").write_text(SUITE)
    two = two_gpu_inventory()
    real = config.choose_targets

    def targets_with_two_visible(cfg):
        t, notes, driver, _ = real(cfg)
        return t, notes, driver, two

    monkeypatch.setattr(pipeline, "choose_targets", targets_with_two_visible)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    code = cli.main(["run", "--cpu-only", "--quiet", "--suite", str(suite), "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 1
    # the re-runs ran exactly the cases that went wrong: with the target current, and with
    # the other device current again (the control)
    rerun = {
        (r["case"].split("::")[1], r["mode"].split("rerun:")[1]): r["status"]
        for r in results.cases(out / "rerun.jsonl")
    }
    assert rerun == {
        ("test_no_guard", "target-current"): "passed",
        ("test_no_guard", "other-current"): "failed",
        ("test_real_bug", "target-current"): "failed",
        ("test_real_bug", "other-current"): "failed",
        ("test_flaky", "target-current"): "passed",
        ("test_flaky", "other-current"): "passed",
    }
    # wrong-device for the case that passed with its target current and failed again in the
    # control; the real bug keeps its own finding; the flaky one did not come back
    lines = list(results.read(out / "results.jsonl"))
    diag = [r for r in lines if r["record"] == "diagnosis"]
    assert sorted((d["case"], d["findings"][0]["kind"]) for d in diag) == [
        ("test_arr.py::test_flaky", "not-reproducible"),
        ("test_arr.py::test_no_guard", "wrong-device"),
    ]
    flaky = next(d for d in diag if "flaky" in d["case"])["findings"][0]
    assert flaky["severity"] == "warning" and "passed when run again both ways" in flaky["message"]
    schema = results.schema()
    for line in lines:
        jsonschema.validate(line, schema)
    assert "wrong-device: cpu arr test_arr.py::test_no_guard" in text
    # the report shows the diagnosis on the case it explains
    doc = json.loads((out / "results.json").read_text())
    kinds = json.dumps(doc)
    assert "wrong-device" in kinds
    assert "wrong-device" in (out / "report.html").read_text()


@pytest.mark.parametrize("visible", [0, 1])
def test_no_rerun_without_a_second_device(tmp_path, monkeypatch, visible):
    suite = tmp_path / "suites" / "arr"
    suite.mkdir(parents=True)
    (suite / "test_arr.py").write_text(SUITE)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert cli.main(["run", "--cpu-only", "--quiet", "--suite", str(suite), "--out", str(out)]) == 1
    assert not (out / "rerun.jsonl").exists()
    assert not [r for r in results.read(out / "results.jsonl") if r["record"] == "diagnosis"]


# -- each question from its own evidence ---------------------------------------------------
def _stream_finding(op: str = "ext._C.render") -> dict:
    return {
        "kind": "wrong-stream",
        "severity": "error",
        "op": op,
        "kernel": "renderCUDA",
        "message": f"{op} launched renderCUDA on cuda:1 on a stream that was not the "
        "caller's current stream",
    }


def _case(mode: str, status: str, current: str, *findings: dict) -> CaseRecord:
    found = CaseRecord.from_json(
        {
            "device": "cuda:1",
            "suite": "zoo",
            "run_id": "r",
            "case": "test_r.py::test_render[cuda1]",
            "mode": mode,
            "status": status,
            "current_device": current,
            "findings": list(findings),
        }
    )
    assert found is not None
    return found


CRASHED = {
    "kind": "cuda-error",
    "severity": "error",
    "op": "ext._C.render",
    "message": "RuntimeError: CUDA error: an illegal memory access was encountered",
}


def test_the_device_comparison_looks_at_the_outcome_not_at_other_detectors_findings():
    """The extension also launches on the legacy stream (nearly every pybind one does): the
    re-run with its target current passes but carries wrong-stream findings. The guard is
    still the diagnosis; a re-run that itself faulted is not clean."""
    first = _case("blocking+nvml", "failed", "cuda:0", CRASHED)
    again = _case("blocking+nvml|rerun:target-current", "passed", "cuda:1", _stream_finding())
    control = _case("blocking+nvml|rerun:other-current", "failed", "cuda:0", CRASHED)
    found = WrongDevice().run_finished([first, again, control])
    assert [(f.kind, f.op) for f in found] == [("wrong-device", "ext._C.render")]
    # the evidence gives the outcomes, not the other question's answer
    assert "(blocking+nvml|rerun:target-current): passed\n" in found[0].evidence
    assert "stream" not in found[0].evidence
    faulted = _case("blocking+nvml|rerun:target-current", "passed", "cuda:1", CRASHED)
    assert WrongDevice().run_finished([first, faulted, control]) == []


def test_the_reruns_other_findings_are_carried_to_their_case_once():
    from gpucheck.controller.reruns import carried

    first = _case("blocking+nvml", "failed", "cuda:0", CRASHED)
    leak = {"kind": "leak", "severity": "error", "op": "ext._C.render", "message": "grows"}
    again = _case(
        "blocking+nvml|rerun:target-current",
        "passed",
        "cuda:1",
        _stream_finding(),
        _stream_finding(),
        leak,
        {"kind": "test-failure", "severity": "error", "message": "assert 1 == 2"},
    )
    control = _case("blocking+nvml|rerun:other-current", "passed", "cuda:0", _stream_finding())
    found = carried([first, again, control])
    # diagnoses only (a re-run's own failure is about the re-run), one per (kind, op), from
    # the target-current re-run alone, on the case they are about
    assert [(f.kind, f.op, f.case, f.device) for f in found] == [
        ("wrong-stream", "ext._C.render", "test_r.py::test_render[cuda1]", "cuda:1"),
        ("leak", "ext._C.render", "test_r.py::test_render[cuda1]", "cuda:1"),
    ]
    assert found[0].evidence.startswith(
        "seen in the wrong-device check's re-run with cuda:1 "
        "current (blocking+nvml|rerun:target-current)"
    )
    # deduplicated with the main pass: what the case's own record says is not said twice
    said = _case("blocking+nvml", "failed", "cuda:0", CRASHED, _stream_finding())
    assert [f.kind for f in carried([said, again])] == ["leak"]
    assert carried([again]) == []  # the case's own record is not in the run: nowhere to go


def test_a_two_gpu_run_reports_the_stream_findings_of_its_reruns(tmp_path):
    """Through the pipeline's diagnosis step on real files: the carried finding becomes a
    diagnosis record of the original case, so the report shows it."""
    from gpucheck.model.layout import RunFolder

    folder = RunFolder(tmp_path)
    first = _case("blocking+nvml", "failed", "cuda:0", CRASHED)
    again = _case("blocking+nvml|rerun:target-current", "passed", "cuda:1", _stream_finding())
    results.append(
        folder.results, {"schema": results.SCHEMA_ID, "record": "run", "run_id": "r", "devices": []}
    )
    results.append(folder.results, first.to_json())
    results.append(folder.rerun, again.to_json())
    pipeline.diagnose(RunLog(folder.results), RunLog(folder.rerun), "r")
    case = RunLog.read(folder.results).diagnosed_cases()[0]
    assert sorted(f.kind for f in case.findings) == ["cuda-error", "wrong-device", "wrong-stream"]
