"""`gpucheck selftest`'s defect x detector matrix, on the self-test run recorded on an H200
and on that run changed the ways a detector could fail."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import pytest

from gpucheck import _resources, cli, selftest
from gpucheck.model import results
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.model.runlog import RunLog
from gpucheck.selftest import DEFECTS, matrix, pass_of, read_run, verdict

RUN = Path(__file__).parents[1] / "fixtures" / "run_h200_selftest"


def rows_by_name(rows):
    return {r.defect.name: r for r in rows}


def test_the_recorded_run_finds_what_one_gpu_can_show():
    records, gpus = read_run(RUN)
    assert gpus == 1
    rows, false = matrix(records, gpus)
    got = {name: r.status for name, r in rows_by_name(rows).items()}
    assert got["abort inside the extension"] == "found"
    assert got["out-of-bounds global write"] == "found"
    # needs a second GPU; the others were recorded before their cases existed
    assert {name for name, status in got.items() if status == "not run"} == {
        d.name for d in DEFECTS
    } - {"abort inside the extension", "out-of-bounds global write"}
    why = {name: r.detail for name, r in rows_by_name(rows).items()}
    assert why["no device guard (pybind extension)"] == "needs 2 GPUs"
    assert why["launch on the legacy default stream (SSIM)"] == (
        "its case did not run in this mode"
    )
    assert why["read of uninitialized memory (KNN)"].startswith("no sanitizer:initcheck pass")
    assert rows_by_name(rows)["out-of-bounds global write"].detail == (
        "sanitizer on cuda:0 · <unnamed>::add_one"
    )
    assert false == []
    assert verdict(rows, false) == 2


def test_a_missing_finding_is_a_miss():
    records, gpus = read_run(RUN)
    records = copy.deepcopy(records)
    for r in records:
        if "test_abort" in r.case:
            r.findings = [f for f in r.findings if f.kind != "crash"]
    rows, false = matrix(records, gpus)
    row = rows_by_name(rows)["abort inside the extension"]
    assert row.status == "missed" and "not found on cuda:0 (blocking+nvml)" in row.detail
    assert verdict(rows, false) == 1


def test_a_finding_on_clean_code_is_a_false_positive():
    records, gpus = read_run(RUN)
    records = copy.deepcopy(records)
    good = next(r for r in records if "test_good_guarded" in r.case)
    good.findings.append(Finding("device-state-leak", "warning", "changed", device=good.device))
    rows, false = matrix(records, gpus)
    assert [f["kind"] for f in false] == ["device-state-leak"]
    assert verdict(rows, false) == 1


def _unguarded(device: str, status: str = "failed") -> dict:
    return {
        "record": "case",
        "device": device,
        "suite": "selftest",
        "mode": "blocking+nvml",
        "case": f"test_selftest.py::test_unguarded_launch[{device.replace(':', '')}]",
        "status": status,
        "findings": [{"kind": "cuda-error", "severity": "error", "device": device}],
    }


def _diagnosis(device: str) -> dict:
    rec = _unguarded(device)
    rec["record"] = "diagnosis"
    rec["findings"] = [{"kind": "wrong-device", "severity": "error", "device": device, "op": None}]
    return rec


@pytest.mark.parametrize(
    ("diagnosed", "status"),
    [(["cuda:0", "cuda:1"], "found"), (["cuda:1"], "missed"), ([], "missed")],
)
def test_wrong_device_must_be_diagnosed_on_every_device(diagnosed, status):
    records = [_unguarded("cuda:0"), _unguarded("cuda:1"), *map(_diagnosis, diagnosed)]
    row = rows_by_name(matrix(typed(records), 2)[0])["no device guard (pybind extension)"]
    assert row.status == status


def test_selftest_command_prints_the_matrix_of_its_run(tmp_path, monkeypatch, capsys, two_gpus):
    from gpucheck.controller import entry, pipeline

    ran = []

    def fake_run(cfg):  # the recorded run stands in for the harness
        ran.append(cfg)
        for f in RUN.iterdir():
            if f.is_file():
                (cfg.out / f.name).write_bytes(f.read_bytes())
        return 1

    monkeypatch.setattr(entry, "run", fake_run)
    built = []
    monkeypatch.setattr(selftest, "prebuild", lambda logs: built.append(logs) or None)
    monkeypatch.chdir(tmp_path)  # the run folder is ./selftest: not a suite of that name
    code = cli.main(["selftest", "--sanitizer", "--out", "selftest"])
    out = capsys.readouterr().out
    assert code == 2
    assert ran[0].suites == (str(_resources.suites() / "selftest"),)
    assert pipeline.suites_mod.resolve(ran[0].suites) == {
        "selftest": (_resources.suites() / "selftest").resolve()
    }
    assert ran[0].modes == (
        "blocking",
        "nvml",
        "sanitizer:memcheck",
        "sanitizer:racecheck",
        "sanitizer:initcheck",
    )
    assert len(built) == 1  # the defect builds are made before the harness starts
    assert "defect x detector" in out and "needs 2 GPUs" in out
    assert (
        f"detected 2 of 2 defects that ran ({len(DEFECTS) - 2} not run); false positives "
        "on clean cases: 0"
    ) in out


# --- records built by hand, in the results.jsonl format -------------------------------------


def typed(records: list[dict]) -> list[CaseRecord]:
    """The records as gpucheck reads them back from results.jsonl (diagnoses attached)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "results.jsonl"
        for r in records:
            results.append(path, r)
        return RunLog.read(path).diagnosed_cases()


def _rec(
    case: str, device: str, mode: str, *findings: dict, status: str = "passed", record: str = "case"
) -> dict:
    return {
        "schema": "gpucheck.results/1",
        "record": record,
        "run_id": "r",
        "device": device,
        "suite": "selftest",
        "mode": mode,
        "status": status,
        "case": f"{case}[{device.replace(':', '')}]",
        "findings": list(findings),
    }


def _finding(
    kind: str,
    device: str,
    severity: str = "error",
    op: str | None = None,
    kernel: str | None = None,
) -> dict:
    return {
        "kind": kind,
        "severity": severity,
        "device": device,
        "op": op,
        "kernel": kernel,
        "message": f"{kind} planted",
    }


NO_SYNC = "test_defect_ssim.py::test_no_sync_ssim"
RACE = "missing __syncthreads (SSIM backward)"
RACE_KERNEL = "gpucheck::ssim::ssim_backward_kernel<float, false>"


def _race(device: str, mode: str, found: bool = True) -> dict:
    hit = [_finding("sanitizer", device, kernel=RACE_KERNEL)] if found else []
    return _rec(NO_SYNC, device, mode, *hit, status="failed" if found else "passed")


def test_modes_of_records_map_to_the_pass_of_a_row():
    assert pass_of("blocking+nvml") == "plain" and pass_of("nvml") == "plain"
    assert pass_of("sanitizer") == "sanitizer:memcheck"
    assert pass_of("sanitizer:racecheck") == "sanitizer:racecheck"
    assert pass_of("sanitizer:racecheck|target-current") == "sanitizer:racecheck"
    assert pass_of("blocking+nvml|rerun:target-current") is None  # evidence, not a pass


def test_a_sanitizer_row_needs_its_own_tools_pass():
    # a memcheck pass ran the no-sync case and found something: not the racecheck row's finding
    records = [_race("cuda:0", "sanitizer:memcheck")]
    row = rows_by_name(matrix(typed(records), 1)[0])[RACE]
    assert row.status == "not run"
    assert row.detail == "no sanitizer:racecheck pass in this run (gpucheck selftest --sanitizer)"
    both = typed([*records, _race("cuda:0", "sanitizer:racecheck")])
    row = rows_by_name(matrix(both, 1)[0])[RACE]
    assert row.status == "found" and row.detail == f"sanitizer on cuda:0 · {RACE_KERNEL}"


def test_a_case_deselected_from_its_tools_pass_did_not_run():
    other = _rec("test_defect_knn.py::test_uninit_read_knn", "cuda:0", "sanitizer:racecheck")
    records = [_race("cuda:0", "sanitizer:racecheck"), other]
    row = rows_by_name(matrix(typed(records), 1)[0])["read of uninitialized memory (KNN)"]
    assert row.status == "not run"


@pytest.mark.parametrize(
    ("missing", "status"),
    [
        (None, "found"),
        (("cuda:1", "sanitizer:racecheck|target-current"), "missed"),
        (("cuda:0", "sanitizer:racecheck"), "missed"),
    ],
)
def test_a_sanitizer_row_must_be_found_in_every_pass_of_its_tool_on_every_device(missing, status):
    records = [
        _race(dev, mode, found=(dev, mode) != missing)
        for dev in ("cuda:0", "cuda:1")
        for mode in ("sanitizer:racecheck", "sanitizer:racecheck|target-current")
    ]
    row = rows_by_name(matrix(typed(records), 2)[0])[RACE]
    assert row.status == status
    if missing:
        assert row.detail.startswith(f"not found on {missing[0]} ({missing[1]})")


SET_DEVICE = "test_defect_knn.py::test_set_device_knn"
LEAK = "bare cudaSetDevice (KNN)"
LEAK_OP = "gpucheck_defect_set_device::knn_mean_sq_dist"


@pytest.mark.parametrize(
    ("severity", "op", "status"),
    [
        ("warning", LEAK_OP, "found"),  # what the device-state-leak detectors emit
        ("error", LEAK_OP, "found"),  # a higher severity names it as well
        ("info", LEAK_OP, "missed"),
        ("warning", None, "missed"),  # the case-level detector alone does not name the op
    ],
)
def test_a_row_accepts_its_kinds_severity_and_needs_its_op(severity, op, status):
    records = [
        _rec(SET_DEVICE, dev, "blocking+nvml", _finding("device-state-leak", dev, severity, op=op))
        for dev in ("cuda:0", "cuda:1")
    ]
    rows = rows_by_name(matrix(typed(records), 2)[0])
    assert rows[LEAK].status == status
    assert rows_by_name(matrix(typed(records), 1)[0])[LEAK].status == "not run"  # one GPU


def test_the_new_plain_rows_on_two_gpus():
    knn = "test_defect_knn.py::"
    records = []
    for dev in ("cuda:0", "cuda:1"):
        records += [
            _rec(
                knn + "test_output_current_device_knn",
                dev,
                "blocking+nvml",
                _finding(
                    "wrong-device",
                    dev,
                    op="gpucheck_defect_output_current_device::knn_mean_sq_dist",
                ),
            ),
            _rec(
                knn + "test_nondeterminism_knn",
                dev,
                "blocking+nvml",
                _finding("numerics", dev, op="gpucheck_defect_nondeterminism::knn_mean_sq_dist"),
            ),
            # no guard: the case fails with another device current, the diagnosis names the op
            _rec(
                knn + "test_no_guard_knn",
                dev,
                "blocking+nvml",
                _finding("cuda-error", dev),
                status="failed",
            ),
            _rec(
                knn + "test_no_guard_knn",
                dev,
                "blocking+nvml",
                _finding(
                    "wrong-device",
                    dev,
                    op="gpucheck::knn::knn_mean_sq_dist_cuda(at::Tensor const&, long)",
                ),
                record="diagnosis",
            ),
            # the clean twin, and its re-run (not a pass of its own)
            _rec(knn + "test_clean_knn", dev, "blocking+nvml"),
            _rec(knn + "test_no_guard_knn", dev, "blocking+nvml|rerun:target-current"),
        ]
    rows, false = matrix(typed(records), 2)
    got = {name: r.status for name, r in rows_by_name(rows).items()}
    assert got["output on the current device (KNN)"] == "found"
    assert got["result differs between runs (KNN)"] == "found"
    assert got["no device guard (KNN)"] == "found"
    assert got["no device guard (SSIM)"] == "not run"
    assert false == []
    # the nondeterminism found under another kind is a miss that says what was seen
    for r in records:
        for f in r["findings"]:
            if f["kind"] == "numerics":
                f["kind"] = "test-failure"
    row = rows_by_name(matrix(typed(records), 2)[0])["result differs between runs (KNN)"]
    assert row.status == "missed" and "test-failure/error" in row.detail


def test_a_sanitizer_finding_on_a_clean_twin_is_a_false_positive():
    records = [
        _rec(
            "test_defect_knn.py::test_clean_knn",
            "cuda:0",
            "sanitizer:initcheck",
            _finding("sanitizer", "cuda:0", kernel="query_kernel<3>"),
        )
    ]
    rows, false = matrix(typed(records), 1)
    assert [(f["case"], f["mode"]) for f in false] == [
        ("test_defect_knn.py::test_clean_knn[cuda0]", "sanitizer:initcheck")
    ]
    assert verdict(rows, false) == 1


def test_prebuild_needs_a_cuda_build_of_torch(tmp_path, monkeypatch):
    """On a machine whose torch has no CUDA (CI), nothing is built and nothing fails."""
    torch = pytest.importorskip("torch")
    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    assert selftest.prebuild(tmp_path / "logs") is None
    assert not (tmp_path / "logs").exists()
    assert selftest.prebuild(tmp_path / "logs", names=[]) is None


PYB = "test_defect_pybind.py::"


def test_the_pybind_rows_on_one_gpu_and_their_cases_exist():
    """The rows of the pybind extension (suites/selftest/test_defect_pybind.py): found from
    the findings its detectors make on one GPU; the two-GPU rows not run there; every row's
    case and clean twin is a test of that file."""
    import ast

    dev = "cuda:0"
    records = [
        _rec(
            PYB + "test_legacy_stream_pybind",
            dev,
            "blocking+nvml",
            _finding("wrong-stream", dev, op="gpucheck_pybind_legacy_stream.scale_forward"),
        ),
        _rec(
            PYB + "test_cub_stream0_pybind",
            dev,
            "blocking+nvml",
            _finding("wrong-stream", dev, op="gpucheck_pybind_cub_stream0.scale_backward"),
        ),
        _rec(
            PYB + "test_unwatched_caller_pybind",
            dev,
            "blocking+nvml",
            _finding(
                "wrong-stream",
                dev,
                kernel="gpucheck_pybind_clean::(anonymous namespace)::"
                "scale_kernel(float const*, float const*, float*, long)",
            ),
        ),
        _rec(
            PYB + "test_cpu_argument_pybind",
            dev,
            "blocking+nvml",
            _finding("mixed-devices", dev, op="gpucheck_pybind_clean.shade"),
            _finding("cuda-error", dev),
            status="failed",
        ),
        _rec(PYB + "test_clean_pybind", dev, "blocking+nvml"),
        _rec(PYB + "test_clean_unwatched_caller_pybind", dev, "blocking+nvml"),
    ]
    rows, false = matrix(typed(records), 1)
    got = {name: r.status for name, r in rows_by_name(rows).items() if "pybind" in r.defect.case}
    assert got == {
        "forward on the legacy default stream (pybind)": "found",
        "cub on stream 0 in backward (pybind)": "found",
        "kernel on stream 0 from an unwatched caller (ctypes)": "found",
        "CPU tensor among CUDA arguments (pybind)": "found",
        "output on the current device (pybind)": "not run",
        "bare cudaSetDevice (pybind)": "not run",
    }
    assert false == []
    records[-1]["findings"].append(_finding("wrong-stream", dev, op="x"))
    assert matrix(typed(records), 1)[1] != []  # a finding on a clean twin is a false positive
    tests = {
        n.name
        for n in ast.parse(
            (_resources.suites() / "selftest" / "test_defect_pybind.py").read_text()
        ).body
        if isinstance(n, ast.FunctionDef)
    }
    cases = [d.case for d in DEFECTS if d.case.startswith(PYB)]
    cases += [c for c in selftest.CLEAN if c.startswith(PYB)]
    assert len(cases) == 8 and {c.removeprefix(PYB) for c in cases} <= tests


def test_prebuild_builds_the_pybind_extension_and_the_zoo_too(tmp_path, monkeypatch):
    import subprocess
    import types

    from gpucheck._csrc import toolchain
    from gpucheck._csrc.pybind import PYBIND_DEFECTS
    from gpucheck._csrc.zoo import ZOO_BUILDS

    monkeypatch.setattr(toolchain, "cuda_home", lambda: tmp_path)
    monkeypatch.setattr(
        subprocess, "run", lambda *a, **k: types.SimpleNamespace(returncode=0, stdout="13.0\n")
    )
    started = []

    class Proc:
        def __init__(self, cmd, **kwargs):
            started.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Proc)
    assert selftest.prebuild(tmp_path / "logs") == []
    pybind = sorted(cmd[-1] for cmd in started if "build_pybind" in cmd[2])
    assert pybind == sorted(["clean", *PYBIND_DEFECTS])
    zoo = sorted(cmd[-1] for cmd in started if "build_zoo" in cmd[2])
    assert zoo == sorted(ZOO_BUILDS)
    assert (tmp_path / "logs" / "zoo_raster_clean.log").exists()
    assert (tmp_path / "logs" / "pybind_clean.log").exists()
