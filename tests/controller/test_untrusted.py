"""What a suite says and what a run folder holds is not trusted.

What a suite says: test ids and messages holding HTML and script, terminal escape codes, NUL,
lone surrogates and bytes that are not UTF-8, in a real run: every case runs and is recorded,
the console shows the escape codes as text, junit.xml and results.json parse, the page escapes.

What a run folder holds: ``gpucheck report`` and ``gpucheck run --resume`` on a folder someone
else produced (a real recorded run, then torn, truncated, reordered, duplicated and hand-edited,
with huge fields, links out of the folder, a FIFO and a pickle that would run code): the report
renders in one command that never hangs, reads nothing through a link, writes nothing outside
the folder and shows nothing unescaped; ``--resume`` refuses such a folder in one sentence
before anything runs. Every fault is made for real (real links, a real FIFO, real bytes)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import clirun

from gpucheck.distributed.rank import read_trace
from gpucheck.model import results
from gpucheck.model.runlog import RunLog

ROOT = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).parents[1] / "fixtures" / "run_h200_selftest"
#: what a terminal acts on: ESC, BEL, NUL
TERMINAL_CONTROLS = ("\x1b", "\x07", "\x00")


def gpucheck(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return clirun.gpucheck(*args, cwd=cwd, errors="surrogateescape", timeout=timeout)


HOSTILE_SUITE = textwrap.dedent("""
    import os
    import sys

    import pytest

    HOSTILE = ["<script>alert(1)</script>", "\\x1b[31mred\\x1b[0m\\x1b]0;title\\x07",
               "bad\\udcffbyte", "nul\\x00char"]


    @pytest.mark.parametrize("text", HOSTILE, ids=HOSTILE)
    def test_hostile_id(text):
        assert text == "", text


    def test_bytes_that_are_not_utf8():
        os.write(1, b"\\xff\\xfe raw bytes on the fd \\x1b[2J\\n")
        sys.stdout.buffer.write(b"\\xff\\xfe not UTF-8 through sys.stdout")
        raise AssertionError(b"\\xff\\xfe\\x1b[31m".decode("utf-8", "surrogateescape"))


    def test_runs_after_them():
        os.write(2, b"\\xff<script>alert(2)</script>\\x1b]0;owned\\x07\\n")
        os.abort()
""")


def test_hostile_ids_and_output_are_recorded_and_shown_as_text(tmp_path):
    suite = tmp_path / "hostile"
    suite.mkdir()
    (suite / "test_hostile.py").write_text(HOSTILE_SUITE)
    out = tmp_path / "out"
    proc = gpucheck("run", "--cpu-only", "--suite", str(suite), "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    # the terminal is shown the codes, never given them
    assert not [c for c in TERMINAL_CONTROLS if c in proc.stdout], proc.stdout
    assert "\\x1b]0;title\\x07" in proc.stdout
    recs = {r.case.rsplit("::", 1)[-1]: r for r in RunLog.read(out / "results.jsonl").cases}
    assert len(recs) == 6
    assert sorted(r.status for r in recs.values()) == ["crashed"] + ["failed"] * 5
    # the bytes that were not UTF-8 fail their own case only; the next case ran (and aborted)
    bad = recs["test_bytes_that_are_not_utf8"]
    assert bad.findings[0].message.startswith("AssertionError")
    assert recs["test_runs_after_them"].status == "crashed"
    ET.parse(out / "junit.xml")  # control characters escaped: it parses
    doc = json.loads((out / "results.json").read_text())
    assert len(doc["cases"]) == 6
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<script>alert" not in page and page.count("<script") == 2
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


# --- a run folder someone else produced ----------------------------------------------------

SECRET = "SECRET-OUTSIDE-THE-FOLDER"


def _hostile_folder(tmp_path: Path) -> tuple[Path, Path]:
    """The recorded H200 run, taken apart and put together again by hand; and a folder
    outside it that must be neither read into the report nor written."""
    run = tmp_path / "run"
    shutil.copytree(RECORDED, run)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    (outside / "bashrc").write_text("untouched\n")
    lines = (run / "results.jsonl").read_text().splitlines()
    header, cases = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    failed = next(c for c in cases if c["status"] == "crashed")
    header["host"] = "<img src=x onerror=alert(3)>"
    header["command"] = ["<script>alert(4)</script>"]
    header["devices"][0]["name"] = "<svg onload=alert(5)>"
    header["notes"] = ["\x1b]0;owned\x07 <b>note</b>"]
    forged = [
        {**failed, "status": "passed", "findings": []},  # a copy of a failure saying "passed"
        {
            **failed,
            "case": "t.py::test_types",
            "duration_s": "x",
            "memory": [],
            "exit_code": "9",
            "findings": [
                {"kind": 1, "severity": "critical", "message": ["not", "text"]},
                "not a finding",
            ],
        },
        {
            **failed,
            "case": "t.py::test_huge",
            "findings": [{"kind": "test-failure", "severity": "error", "message": "M" * 5_000_000}],
        },
        {**failed, "case": "t.py::test_status", "status": "exploded"},
        {**failed, "case": "t.py::<script>alert(6)</script>", "reason": "<b>bold</b>"},
    ]
    out = [
        json.dumps(forged[0]),
        *(json.dumps(c) for c in reversed(cases)),  # reordered
        json.dumps(header),
        *(json.dumps(c) for c in forged[1:]),
        "[" * 200_000,  # nested past the parser's recursion limit
        "[1, 2]",
        "42",
        '"text"',
        '{"record": "case", "torn',
        json.dumps(failed)[: len(json.dumps(failed)) // 2],
    ]  # cut without its newline
    (run / "results.jsonl").write_text("\n".join(out))
    timeline = run / "nvml_timeline.jsonl"
    with open(timeline, "a") as f:
        f.write(
            '{"t": Infinity, "devices": []}\n{"t": NaN}\n{"t": 1e400, "devices": [1]}\n'
            '{"t": 1, "devices": ["x", {"uuid": "u", "used": "lots"}]}\n'
        )
    workers = run / "workers"
    (workers / "evil.log").symlink_to(outside / "secret.txt")
    (workers / "cuda9.blocking.state.json").symlink_to("/dev/zero")  # would never end
    os.mkfifo(workers / "cuda8.blocking.state.json")  # would block
    os.mkfifo(run / "checkpoint_lint.jsonl")
    (run / "report.html").symlink_to(outside / "bashrc")
    (run / ".report.html.tmp").symlink_to(outside / "bashrc")  # an old temporary name
    (workers / "rank0.dist.nccl_trace.pkl").write_bytes(pickle.dumps(_Payload(tmp_path)))
    return run, outside


class _Payload:
    """A pickle that would run code when loaded."""

    def __init__(self, where: Path) -> None:
        self.where = where

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.where}/PWNED",))


def test_report_on_a_folder_someone_else_produced(tmp_path):
    run, outside = _hostile_folder(tmp_path)
    proc = gpucheck(
        "report",
        str(run),
        "--format",
        "html",
        "--format",
        "json",
        "--format",
        "junit",
        "--format",
        "sarif",
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the recorded failures stand
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not [c for c in TERMINAL_CONTROLS if c in proc.stdout]
    assert "could not be read" in proc.stdout
    # nothing outside the folder was written; the link was replaced, not followed
    assert (outside / "bashrc").read_text() == "untouched\n"
    assert not (run / "report.html").is_symlink()
    assert not (tmp_path / "PWNED").exists()
    page = (run / "report.html").read_text(encoding="utf-8")
    assert SECRET not in page  # the linked log is neither read nor linked
    assert "evil.log" not in page
    for raw in (
        "<img src=x onerror=alert(3)>",
        "<script>alert(4)",
        "<svg onload=alert(5)>",
        "<script>alert(6)",
    ):
        assert raw not in page
    assert "&lt;script&gt;alert(6)&lt;/script&gt;" in page  # shown, as text
    assert page.count("<script") == 2
    doc = json.loads((run / "results.json").read_text())
    problems = " ".join(doc["state"]["problems"])
    assert "line(s) of results.jsonl could not be read" in problems
    assert "repeated record(s)" in problems
    by_case = {c["case"]: c for c in doc["cases"]}
    crashed = [c["case"] for c in doc["cases"] if c["status"] == "crashed"]
    assert len(crashed) == len(set(crashed)) == 5  # the forged "passed" copy of one lost
    typed = by_case["t.py::test_types"]
    assert typed["duration_s"] == 0.0 and typed["memory"] == {} and typed["exit_code"] is None
    assert [f["severity"] for f in typed["findings"]] == ["error", "error"]
    assert "t.py::test_status" not in by_case  # a status no writer writes is not a record
    huge = by_case["t.py::test_huge"]["findings"][0]["message"]
    assert len(huge) < 30_000 and huge.endswith("more characters cut when read)")
    assert len((run / "report.html").read_bytes()) < 2_000_000
    ET.parse(run / "junit.xml")
    json.loads((run / "results.sarif").read_text())


def test_the_flight_recorder_reader_runs_no_code(tmp_path):
    path = tmp_path / "trace.pkl"
    path.write_bytes(pickle.dumps({"entries": [_Payload(tmp_path)]}))
    assert read_trace(path) == [] and not (tmp_path / "PWNED").exists()
    path.write_bytes(
        pickle.dumps(
            {
                "entries": [
                    {
                        "collective_seq_id": 7,
                        "profiling_name": "nccl:all_reduce",
                        "state": "scheduled",
                    }
                ]
            }
        )
    )
    assert read_trace(path)[0]["seq"] == 7


def _resumable_folder(tmp_path: Path) -> Path:
    """A real run of a tiny suite whose end record is missing (its controller was killed
    after the last case): what ``--resume`` accepts as it is."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_a.py").write_text("def test_a():\n    pass\n")
    out = tmp_path / "run"
    proc = gpucheck("run", "--cpu-only", "--suite", str(suite), "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text(
        "".join(line for line in lines if json.loads(line)["record"] != "end")
    )
    return out


def _edit_header(run: Path, edit) -> None:
    lines = (run / "results.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    edit(header)
    (run / "results.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")


def test_resume_refuses_a_folder_that_would_run_its_own_code_or_write_out(tmp_path):
    run = _resumable_folder(tmp_path)
    planted = run / "planted"
    planted.mkdir()
    (planted / "test_planted.py").write_text(
        f"import pathlib\npathlib.Path({str(tmp_path / 'PWNED')!r}).touch()\n"
        "def test_p():\n    pass\n"
    )
    original = (run / "results.jsonl").read_text()
    cases = [
        (
            lambda h: h["config"]["suite_paths"].update(planted=str(planted)),
            "lies inside the run folder",
        ),
        (lambda h: h["config"].update(pytest_args="-p evil"), "'pytest_args'"),
        (lambda h: h["config"].update(timeout="never"), "'timeout'"),
        (
            lambda h: h["config"]["suite_paths"].update(gone=str(tmp_path / "gone")),
            "no longer exists",
        ),
    ]
    for edit, said in cases:
        (run / "results.jsonl").write_text(original)
        _edit_header(run, edit)
        proc = gpucheck("run", "--resume", str(run), cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert said in proc.stderr and "cannot resume" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "PWNED").exists()
    shutil.rmtree(planted)
    (run / "results.jsonl").write_text(original)
    (run / "workers" / "elsewhere.log").symlink_to(tmp_path / "bashrc")
    proc = gpucheck("run", "--resume", str(run), cwd=tmp_path)
    assert proc.returncode == 2 and "a link or a special file" in proc.stderr
    assert not (tmp_path / "bashrc").exists()
    (run / "workers" / "elsewhere.log").unlink()
    proc = gpucheck("run", "--resume", str(run), cwd=tmp_path)  # as it was: resumes
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r.case for r in RunLog.read(run / "results.jsonl").cases] == ["test_a.py::test_a"]
    assert results.read_lines(run / "results.jsonl")[1] == 0
