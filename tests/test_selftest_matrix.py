"""`gpucheck selftest`'s defect x detector matrix, on the self-test run recorded on an H200
and on that run changed the ways a detector could fail."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gpucheck import cli
from gpucheck.selftest import matrix, read_run, verdict

RUN = Path(__file__).parent / "fixtures" / "run_h200_selftest"


def rows_by_name(rows):
    return {r.defect.name: r for r in rows}


def test_the_recorded_run_finds_what_one_gpu_can_show():
    records, gpus = read_run(RUN)
    assert gpus == 1
    rows, false = matrix(records, gpus)
    got = {name: r.status for name, r in rows_by_name(rows).items()}
    assert got == {
        "no device guard (pybind extension)": "not run",      # needs a second GPU
        "abort inside the extension": "found",
        "out-of-bounds global write": "found",
        "launch on the legacy default stream (SSIM)": "not run",  # recorded before it existed
    }
    assert rows_by_name(rows)["out-of-bounds global write"].detail == (
        "sanitizer on cuda:0 · <unnamed>::add_one")
    assert false == []
    assert verdict(rows, false) == 2


def test_a_missing_finding_is_a_miss():
    records, gpus = read_run(RUN)
    records = copy.deepcopy(records)
    for r in records:
        if "test_abort" in r["case"]:
            r["findings"] = [f for f in r["findings"] if f["kind"] != "crash"]
    rows, false = matrix(records, gpus)
    row = rows_by_name(rows)["abort inside the extension"]
    assert row.status == "missed" and "no device" in row.detail
    assert verdict(rows, false) == 1


def test_a_finding_on_clean_code_is_a_false_positive():
    records, gpus = read_run(RUN)
    records = copy.deepcopy(records)
    good = next(r for r in records if "test_good_guarded" in r["case"])
    good["findings"].append({"kind": "device-state-leak", "severity": "warning",
                             "message": "changed", "device": good["device"]})
    rows, false = matrix(records, gpus)
    assert [f["kind"] for f in false] == ["device-state-leak"]
    assert verdict(rows, false) == 1


def _unguarded(device: str, status: str = "failed") -> dict:
    return {"record": "case", "device": device, "suite": "selftest", "mode": "blocking+nvml",
            "case": f"test_selftest.py::test_unguarded_launch[{device.replace(':', '')}]",
            "status": status, "findings": [
                {"kind": "cuda-error", "severity": "error", "device": device}]}


def _diagnosis(device: str) -> dict:
    rec = _unguarded(device)
    rec["record"] = "diagnosis"
    rec["findings"] = [{"kind": "wrong-device", "severity": "error", "device": device,
                        "op": None}]
    return rec


@pytest.mark.parametrize(("diagnosed", "status"), [
    (["cuda:0", "cuda:1"], "found"), (["cuda:1"], "missed"), ([], "missed")])
def test_wrong_device_must_be_diagnosed_on_every_device(diagnosed, status):
    records = [_unguarded("cuda:0"), _unguarded("cuda:1"), *map(_diagnosis, diagnosed)]
    row = rows_by_name(matrix(records, 2)[0])["no device guard (pybind extension)"]
    assert row.status == status


def test_selftest_command_prints_the_matrix_of_its_run(tmp_path, monkeypatch, capsys):
    from gpucheck.runner import pipeline

    ran = []

    def fake_run(cfg):  # the recorded run stands in for the harness
        ran.append(cfg)
        for f in RUN.iterdir():
            if f.is_file():
                (cfg.out / f.name).write_bytes(f.read_bytes())
        return 1

    monkeypatch.setattr(pipeline, "run", fake_run)
    code = cli.main(["selftest", "--sanitizer", "--out", str(tmp_path / "st")])
    out = capsys.readouterr().out
    assert code == 2
    assert ran[0].suites == ("selftest",) and "sanitizer:memcheck" in ran[0].modes
    assert "defect x detector" in out and "needs 2 GPUs" in out
    assert "detected 2 of 2 defects that ran (2 not run); false positives on clean cases: 0" \
        in out
