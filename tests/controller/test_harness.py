"""`gpucheck run` end to end on CPU: real worker processes running a real suite with passing,
failing, skipped, aborting and hanging cases; the records, JUnit XML and exit codes they give."""

from __future__ import annotations

import signal
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from clirun import gpucheck
from demosuite import SUITE, start_until_stuck

from gpucheck.model import results


@pytest.fixture
def project(tmp_path):
    suite = tmp_path / "suites" / "demo"
    suite.mkdir(parents=True)
    (suite / "test_demo.py").write_text(SUITE)
    return tmp_path


def run(project, *args, env=None, timeout=180):
    return gpucheck("run", "--cpu-only", "--quiet", *args, cwd=project, timeout=timeout, env=env)


def by_case(path: Path):
    return {r["case"].rsplit("::", 1)[-1]: r for r in results.cases(path)}


def test_records_statuses_findings_and_junit(project):
    out = project / "out"
    proc = run(project, "--out", str(out), env={"DEMO_CUDA_ERROR": "1"})
    assert proc.returncode == 1, proc.stderr  # failures are findings of severity error
    recs = by_case(out / "results.jsonl")
    assert {k: r["status"] for k, r in recs.items()} == {
        "test_ok": "passed",
        "test_fail": "failed",
        "test_skip": "skipped",
        "test_gpu[nocuda]": "skipped",
        "test_setup_error": "error",
        "test_cuda_error": "failed",
        "test_abort": "passed",
        "test_hang": "passed",
        "test_last": "passed",
    }
    assert recs["test_skip"]["reason"] == "not on this machine"
    assert recs["test_gpu[nocuda]"]["reason"] == "no CUDA device visible"
    fail = recs["test_fail"]["findings"][0]
    assert fail["kind"] == "test-failure" and fail["severity"] == "error"
    assert "assert [1, 2] == [1, 3]" in fail["message"]
    assert recs["test_setup_error"]["findings"][0]["message"].endswith("(in setup)")
    (cuda,) = recs["test_cuda_error"]["findings"]  # not again for the teardown's error
    assert cuda["kind"] == "cuda-error" and "device guard" in cuda["hint"]
    # an illegal memory access leaves the CUDA context unusable: that worker stopped and a
    # fresh one ran the remaining cases
    assert (out / "workers" / "cpu.blocking.1.cmd").exists()
    assert "test_cuda_error" in (out / "workers" / "cpu.blocking.1.skip.txt").read_text()
    for r in recs.values():
        assert r["device"] == "cpu" and r["suite"] == "demo" and r["mode"] == "blocking"
        assert r["duration_s"] >= 0
    # every line (header included) is valid against the shipped schema
    schema = results.schema()
    lines = list(results.read(out / "results.jsonl"))
    assert lines[0]["record"] == "run" and lines[0]["suites"] == ["demo"]
    for line in lines:
        jsonschema.validate(line, schema)
    # JUnit agrees with the records
    root = ET.parse(out / "junit.xml").getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == (
        "9",
        "2",
        "1",
        "2",
    )


def test_clean_run_exits_0(project):
    out = project / "out"
    proc = run(project, "--out", str(out), "--", "-k", "test_ok or test_last")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["status"] for r in results.cases(out / "results.jsonl")] == ["passed", "passed"]


def test_abort_becomes_a_crashed_record_with_signal_and_stderr(project):
    out = project / "out"
    proc = run(project, "--out", str(out), env={"DEMO_ABORT": "1"})
    assert proc.returncode == 1
    recs = by_case(out / "results.jsonl")
    crash = recs["test_abort"]
    assert crash["status"] == "crashed"
    assert crash["signal"] == "SIGABRT"
    assert crash["findings"][0]["kind"] == "crash"
    assert "test_abort" in crash["stderr_tail"]  # pytest's faulthandler names the frame
    # native stderr is not captured away, and the line that explains the crash comes first
    assert crash["stderr_tail"].startswith(
        "terminate called after throwing an instance of 'thrust::system_error'"
    )
    # what finished before the crash is kept, and a fresh worker ran the rest
    assert recs["test_ok"]["status"] == "passed"
    assert recs["test_hang"]["status"] == "passed" and recs["test_last"]["status"] == "passed"
    assert len(recs) == 9


def test_hang_becomes_a_hung_record_with_every_threads_stack(project):
    out = project / "out"
    t0 = time.monotonic()
    proc = run(project, "--out", str(out), "--timeout", "2", env={"DEMO_HANG": "1"})
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 1
    hung = by_case(out / "results.jsonl")["test_hang"]
    assert hung["status"] == "hung"
    assert "no progress for 2 s" in hung["reason"]
    assert "in test_hang" in hung["findings"][0]["evidence"]  # the frame where it hung
    assert by_case(out / "results.jsonl")["test_last"]["status"] == "passed"


def test_ctrl_c_keeps_finished_records_and_writes_junit(project):
    out = project / "out"
    proc, _ = start_until_stuck(project, out)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    recs = by_case(out / "results.jsonl")
    assert recs["test_ok"]["status"] == "passed"
    assert (out / "junit.xml").exists()
    assert "interrupted" in stdout


OP_CRASH_SUITE = textwrap.dedent("""
    import os
    import torch

    @torch.library.custom_op("gpucheck_demo::fine", mutates_args=())
    def fine(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @torch.library.custom_op("gpucheck_demo::dies", mutates_args=())
    def dies(x: torch.Tensor) -> torch.Tensor:
        os.abort()  # what a CUDA extension's uncaught C++ exception does

    def test_dies_inside_an_op():
        x = torch.ops.gpucheck_demo.fine(torch.rand(4))
        torch.ops.gpucheck_demo.dies(x)

    @torch.library.custom_op("gpucheck_demo::faults", mutates_args=())
    def faults(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def test_cuda_error_in_an_op():
        torch.ops.gpucheck_demo.faults(torch.rand(2))

    def test_after():
        assert torch.ops.gpucheck_demo.fine(torch.zeros(1)).item() == 1
""")


def test_a_crash_inside_an_extension_op_names_the_op(tmp_path):
    suite = tmp_path / "suites" / "ops"
    suite.mkdir(parents=True)
    (suite / "test_ops.py").write_text(OP_CRASH_SUITE)
    out = tmp_path / "out"
    proc = run(tmp_path, "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = by_case(out / "results.jsonl")
    crash = recs["test_dies_inside_an_op"]
    assert crash["status"] == "crashed" and crash["signal"] == "SIGABRT"
    f = crash["findings"][0]
    assert (f["kind"], f["op"]) == ("crash", "gpucheck_demo::dies")
    assert "last extension op called: gpucheck_demo::dies" in f["message"]
    err = recs["test_cuda_error_in_an_op"]["findings"][0]
    assert (err["kind"], err["op"]) == ("cuda-error", "gpucheck_demo::faults")
    assert recs["test_after"]["status"] == "passed"
