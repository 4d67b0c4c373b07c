"""The report formats: each a writer of one protocol, registered in one table
(``gpucheck.report.WRITERS``), its file named in ``model/layout.py``'s ``REPORTS``. A new
format added the way docs/architecture.md says is written by ``publish`` without an edit of
the code that calls the formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucheck import cli, report
from gpucheck.model import layout, results
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.report.writer import Report


def _run(tmp_path: Path) -> Path:
    """A run folder: one passed case, one failed with a diagnosis."""
    run = tmp_path / "run"
    run.mkdir()
    path = run / layout.RESULTS
    results.append(path, {"schema": results.SCHEMA_ID, "record": "run", "run_id": "r1"})
    ok = CaseRecord("r1", "cpu", "demo", "t.py::ok", "blocking", "passed")
    bad = CaseRecord("r1", "cpu", "demo", "t.py::bad", "blocking", "failed", "AssertionError")
    bad.findings = [Finding("wrong-stream", "error", "op ext.f launched on stream 0", op="ext.f")]
    for r in (ok, bad):
        results.append(path, r.to_json())
    return run


def toy(rep: Report, path: Path) -> str:
    """A toy format: the verdict, then one line per diagnosis."""
    lines = [f"{rep.verdict.name} {rep.summary.cases}"]
    lines += [f"{g.kind} {g.subject}" for g in rep.grouped.diagnoses]
    return "\n".join(lines) + "\n"


@pytest.fixture
def toy_format(monkeypatch):
    """The recipe of docs/architecture.md: a writer, one line in the table, its file."""
    monkeypatch.setitem(report.WRITERS, "toy", toy)
    monkeypatch.setitem(layout.REPORTS, "toy", "toy.txt")


def test_every_format_has_a_writer_and_a_file():
    assert set(report.WRITERS) == set(layout.REPORTS) == set(report.FORMATS)
    # the command line offers the formats of the table (without importing the report)
    assert tuple(layout.REPORTS) == cli.FORMATS


def test_a_new_format_is_a_writer_and_one_line(tmp_path, toy_format):
    run = _run(tmp_path)
    done = report.publish(run, formats=("toy", "json"))
    assert set(done.paths) == {"toy", "json"}
    assert (run / "toy.txt").read_text() == "failed 2\nwrong-stream ext.f\n"
    doc = json.loads((run / "results.json").read_text())
    assert doc["summary"]["verdict"] == done.verdict.name == "failed"


def test_an_unknown_format_is_refused_in_one_sentence(tmp_path):
    with pytest.raises(ValueError, match=r"unknown report format\(s\) \['pdf'\]; known: html"):
        report.publish(_run(tmp_path), formats=("pdf",))


def test_the_page_is_rendered_from_the_run_not_from_the_json_document(tmp_path, monkeypatch):
    """report.html and results.json say the same of a run, each written from the run's
    report: the page is written even when the JSON document is not asked for, or cannot be
    made."""

    def broken(*args: object) -> dict:
        raise AssertionError("the page must not need results.json")

    monkeypatch.setattr("gpucheck.report.document.build", broken)
    run = _run(tmp_path)
    done = report.publish(run, formats=("html",))
    page = done.paths["html"].read_text()
    assert "<title>gpucheck failed: r1</title>" in page
    assert "wrong-stream" in page and "2 case record(s) on 1 device(s)" in page
