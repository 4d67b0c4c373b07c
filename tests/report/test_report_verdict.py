"""One verdict everywhere: the rule's table, and real `gpucheck run` / `gpucheck report`
invocations whose exit code, last line, results.json, report.html, junit.xml and results.sarif
must all say the same."""

from __future__ import annotations

import json
import subprocess
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from clirun import gpucheck

from gpucheck.model import results
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.model.runlog import CasePlan
from gpucheck.report import rundata


def _case(case: str, status: str, *findings: Finding, run_id: str = "r") -> dict:
    return CaseRecord(
        run_id=run_id,
        device="cpu",
        suite="demo",
        case=case,
        mode="blocking",
        status=status,
        findings=list(findings),
    ).to_json()


def _header(**config) -> dict:
    return {
        "schema": results.SCHEMA_ID,
        "record": "run",
        "run_id": "r",
        "started_at": "2026-11-25T10:00:00+00:00",
        "gpucheck_version": "0.1.0",
        "devices": [{"device": "cpu", "uuid": None, "name": None}],
        "suites": ["demo"],
        "modes": ["blocking"],
        "config": config,
        "not_runnable": {},
    }


def _end(interrupted: bool = False) -> dict:
    return {
        "schema": results.SCHEMA_ID,
        "record": "end",
        "run_id": "r",
        "finished_at": "2026-11-25T10:01:00+00:00",
        "interrupted": interrupted,
        "reason": "stopped by Ctrl-C" if interrupted else None,
    }


PASS = _case("t.py::ok", "passed")
#: the worker planned t.py::ok and t.py::never: a run whose record of t.py::never is missing
PLANNED = CasePlan("r", "cpu", "blocking", {"demo": ["t.py::ok", "t.py::never"]}).to_json()
PLANNED_OK = CasePlan("r", "cpu", "blocking", {"demo": ["t.py::ok"]}).to_json()
FAIL = _case("t.py::bad", "failed", Finding("test-failure", "error", "assert 1 == 2"))
SKIP = _case("t.py::gpu", "skipped")
WARN = _case("t.py::leaky", "passed", Finding("device-state-leak", "warning", "moved"))
DIAG_ON_PASS = _case("t.py::guard", "passed", Finding("wrong-device", "error", "no guard"))
UNCOLLECTABLE = _case(
    "t_syntax.py",
    "error",
    Finding(
        "collection-error",
        "error",
        "t_syntax.py of suite demo cannot be collected: SyntaxError",
        evidence='E     File "/src/demo/t_syntax.py", line 3\nE   SyntaxError: invalid syntax',
    ),
)


@pytest.mark.parametrize(
    ("lines", "kwargs", "name", "code"),
    [
        ([_header(), PASS, _end()], {}, "passed", 0),
        ([_header(), PASS, SKIP, _end()], {}, "passed", 0),
        ([_header(), PASS, WARN, _end()], {}, "warnings", 0),
        ([_header(), PASS, FAIL, _end()], {}, "failed", 1),
        ([_header(), DIAG_ON_PASS, _end()], {}, "failed", 1),  # a diagnosis on a passing case
        ([_header(), SKIP, SKIP, _end()], {}, "nothing-tested", 2),
        ([_header(), _end()], {}, "nothing-tested", 2),
        ([_header(allow_empty=True), SKIP, _end()], {}, "nothing-tested", 0),
        ([_header(), SKIP, _end()], {"allow_empty": True}, "nothing-tested", 0),
        ([_header(), PASS, _end(interrupted=True)], {}, "interrupted", 2),
        ([_header(), PASS, _end(interrupted=True)], {"stopped_by": "Ctrl-C"}, "interrupted", 130),
        ([_header(), PASS, _end(interrupted=True)], {"stopped_by": "SIGTERM"}, "interrupted", 143),
        ([_header(), FAIL, _end(interrupted=True)], {}, "failed", 1),  # findings outrank the stop
        ([_header(), PASS, _end(), "TORN"], {}, "incomplete", 2),
        ([_header(), FAIL, _end(), "TORN"], {}, "failed", 1),
        ([{**_header(), "not_runnable": {"knn": "not built"}}, PASS, _end()], {}, "incomplete", 2),
        # a suite none of whose files could be collected could not run: incomplete, not failed
        ([_header(), UNCOLLECTABLE, _end()], {}, "incomplete", 2),
        # one uncollectable file among cases that ran: that file is a finding of the run
        ([_header(), PASS, UNCOLLECTABLE, _end()], {}, "failed", 1),
        # a case a worker planned and nothing recorded: not a pass (a rank that stopped, a
        # record lost on the way)
        ([_header(), PLANNED_OK, PASS, _end()], {}, "passed", 0),
        ([_header(), PLANNED, PASS, _end()], {}, "incomplete", 2),
        ([_header(), PLANNED, FAIL, _end()], {}, "failed", 1),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_the_verdict_table(tmp_path, monkeypatch, lines, kwargs, name, code):
    from gpucheck.report.verdict import decide

    monkeypatch.chdir("/")  # paths are shown relative to the folder run from

    path = tmp_path / "results.jsonl"
    for line in lines:
        if line == "TORN":
            with open(path, "a") as f:
                f.write('{"schema": "gpucheck.results/1", "record": "ca')
        else:
            results.append(path, line)
    verdict = decide(rundata.load(tmp_path), **kwargs)
    assert (verdict.name, verdict.exit_code) == (name, code)
    assert verdict.ok is (code == 0)
    if name != "passed":
        assert verdict.why  # a reason to read, always
    if "TORN" in lines:
        assert any(str(path) in p for p in verdict.problems)  # the file is named
    if name == "incomplete" and PLANNED in lines:
        assert verdict.why == [
            "1 case(s) that cpu planned in mode blocking have no record (t.py::never)"
        ]
    if name == "incomplete" and UNCOLLECTABLE in lines:
        assert verdict.why == [
            "suite demo did not run: src/demo/t_syntax.py:3: t_syntax.py "
            "of suite demo cannot be collected: SyntaxError"
        ]


def test_a_suite_whose_only_file_has_a_syntax_error_is_incomplete_naming_file_and_line(tmp_path):
    suite = tmp_path / "mine"
    suite.mkdir()
    (suite / "test_mine.py").write_text("import torch\n\ndef test_x(:\n    pass\n")
    out = tmp_path / "out"
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--suite",
        str(suite / "test_mine.py"),
        "--out",
        str(out),
        timeout=180,
        cwd=tmp_path,
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    where = "mine/test_mine.py:3"  # relative to the folder the run was started from
    # the live line (no terminal) and the verdict's reason both say where the error is
    assert f"collection-error: cpu blocking test_mine.py: {where}: " in proc.stdout
    assert f"incomplete: suite test_mine did not run: {where}: " in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("incomplete (exit 2): ")
    assert json.loads((out / "results.json").read_text())["summary"]["verdict"] == "incomplete"


def test_collection_errors_name_their_files_in_one_style_relative_to_the_folder_run_from(
    tmp_path,
):
    """A syntax error (Python names the file by its absolute path) and an import error
    (pytest names it relative to the current folder) are shown alike."""
    suite = tmp_path / "mine"
    suite.mkdir()
    (suite / "test_syntax.py").write_text("def test_x(:\n    pass\n")
    (suite / "test_import.py").write_text("import no_such_module_of_gpucheck_tests\n")
    (suite / "test_fine.py").write_text("def test_fine():\n    pass\n")
    (tmp_path / "here").mkdir()
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--suite",
        "../mine",
        "--out",
        str(tmp_path / "out"),
        timeout=180,
        cwd=tmp_path / "here",
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for name in ("test_syntax.py", "test_import.py"):
        assert f"collection-error: cpu blocking {name}: ../mine/{name}:1: " in proc.stdout
    assert str(tmp_path) not in proc.stdout.split("gpucheck summary")[0]


SUITE = textwrap.dedent("""
    def test_passes():
        assert 1 + 1 == 2

    def test_fails():
        assert [1] == [2]

    def test_needs_gpu(gpu_device):
        pass
""")


def _run(tmp_path: Path, name: str, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    suite = tmp_path / "suite" / "demo"
    suite.mkdir(parents=True, exist_ok=True)
    (suite / "test_demo.py").write_text(SUITE)
    out = tmp_path / name
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--quiet",
        "--suite",
        str(suite),
        "--out",
        str(out),
        "--format",
        "html",
        "--format",
        "json",
        "--format",
        "junit",
        "--format",
        "sarif",
        *args,
        timeout=180,
        cwd=tmp_path,
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    return proc, out


def _stated(proc: subprocess.CompletedProcess, out: Path) -> dict[str, object]:
    """The verdict (and exit code) each output states."""
    last = proc.stdout.strip().splitlines()[-1]
    doc = json.loads((out / "results.json").read_text())
    html = (out / "report.html").read_text()
    title = html.split("<title>")[1].split("</title>")[0]
    root = ET.parse(out / "junit.xml").getroot()
    junit_fails = int(root.get("failures")) + int(root.get("errors"))
    sarif = json.loads((out / "results.sarif").read_text())["runs"][0]
    invocation = sarif["invocations"][0]
    return {
        "exit": proc.returncode,
        "line": last.split(" (exit ")[0],
        "line_exit": int(last.split(" (exit ")[1].split(")")[0]),
        "json": doc["summary"]["verdict"],
        "json_exit": doc["summary"]["exit_code"],
        "html": title.split(":")[0].removeprefix("gpucheck "),
        "junit_passes": junit_fails == 0,
        "sarif": invocation["properties"]["verdict"],
        "sarif_exit": invocation["exitCode"],
        "sarif_ok": invocation["executionSuccessful"],
    }


@pytest.mark.parametrize(
    ("select", "name", "code"),
    [
        (["-k", "test_passes"], "passed", 0),
        ([], "failed", 1),
        (["-k", "test_needs_gpu"], "nothing-tested", 2),
    ],
)
def test_every_output_states_the_same_verdict_as_the_exit_code(tmp_path, select, name, code):
    proc, out = _run(tmp_path, "run", *(["--", *select] if select else []))
    assert "Traceback" not in proc.stderr
    assert _stated(proc, out) == {
        "exit": code,
        "line": name,
        "line_exit": code,
        "json": name,
        "json_exit": code,
        "html": name,
        "junit_passes": code == 0,
        "sarif": name,
        "sarif_exit": code,
        "sarif_ok": code == 0,
    }
    # `gpucheck report` of the same folder says it again
    again = gpucheck("report", str(out), timeout=120)
    assert again.returncode == code and again.stdout.startswith(f"{name}: ")


def test_a_run_that_tested_nothing_is_not_clean_anywhere(tmp_path):
    """The first observation: all cases skipped, the CLI said so, the page said CLEAN."""
    proc, out = _run(tmp_path, "run", "--", "-k", "test_needs_gpu")
    assert proc.returncode == 2 and "nothing was tested" in proc.stdout
    html = (out / "report.html").read_text()
    assert "CLEAN" not in html and "NOTHING-TESTED" in html
    assert json.loads((out / "results.json").read_text())["summary"]["verdict"] == "nothing-tested"
    verdict_case = (
        ET.parse(out / "junit.xml")
        .getroot()
        .find("testsuite[@name='gpucheck']/testcase[@name='verdict']/error")
    )
    assert verdict_case is not None and verdict_case.get("type") == "nothing-tested"
    allowed, out2 = _run(tmp_path, "allowed", "--allow-empty", "--", "-k", "test_needs_gpu")
    assert allowed.returncode == 0
    assert _stated(allowed, out2)["junit_passes"] is True


def test_report_names_a_torn_results_file_and_fails(tmp_path):
    """The second observation: a torn last line printed `clean` and exited 0."""
    proc, out = _run(tmp_path, "run", "--", "-k", "test_passes")
    assert proc.returncode == 0
    with open(out / "results.jsonl", "a") as f:
        f.write('{"schema": "gpucheck.results/1", "record": "case", "device": "cp')
    rep = gpucheck("report", str(out), timeout=120)
    assert rep.returncode == 2
    assert rep.stdout.startswith("incomplete: ")
    assert f"1 line(s) of {out / 'results.jsonl'} could not be read" in rep.stdout
    assert "clean" not in rep.stdout and "passed" not in rep.stdout.splitlines()[0]
    doc = json.loads((out / "results.json").read_text())
    assert doc["summary"]["verdict"] == "incomplete" and doc["summary"]["exit_code"] == 2


def test_random_bytes_are_not_a_gpucheck_results_file_not_a_torn_line(tmp_path):
    import random

    from gpucheck.report.verdict import decide

    blob = (
        random.Random(7).randbytes(3000).replace(b"\n", b"")
        + b"\n"
        + bytes(range(256)).replace(b"\n", b"")
    )
    (tmp_path / "results.jsonl").write_bytes(blob)
    verdict = decide(rundata.load(tmp_path))
    assert (verdict.name, verdict.exit_code) == ("incomplete", 2)
    assert verdict.problems == [
        f"{tmp_path / 'results.jsonl'} is not a gpucheck results file: none of its 2 line(s) "
        "is a record gpucheck writes (no run header, no case)"
    ]
    assert "killed mid-line" not in " ".join(verdict.why)
    proc = gpucheck("report", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert "is not a gpucheck results file" in proc.stdout
    assert "killed mid-line" not in proc.stdout + proc.stderr
