"""Results of a run: the results.jsonl format, its JSON Schema, and the reports made from it.

``publish(run_dir)`` (re)writes the reports of a run folder from what it holds and returns
them with the run's verdict (:mod:`gpucheck.report.verdict`, the one rule every output
states): ``report.html`` (one self-contained page), ``results.json`` (one JSON document, see
``document``), ``junit.xml`` and, when asked, ``results.sarif`` (SARIF 2.1.0, see ``sarif``).
Each format is a writer (:class:`gpucheck.report.writer.Writer`) registered in
:data:`WRITERS`, its file named in :data:`gpucheck.model.layout.REPORTS`. It works on an
interrupted run too (torn last line, no header, no timeline) and never raises on the
folder's content. ``write_all`` is the same, returning only the paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpucheck.model.layout import DEFAULT_REPORTS, REPORTS
from gpucheck.model.runlog import RunLog
from gpucheck.report import document, groups, html, junit, rundata, sarif
from gpucheck.report.rundata import RunData
from gpucheck.report.verdict import Verdict, decide
from gpucheck.report.writer import Report, Writer, write_file

#: every report format: name -> file in the run folder
FORMATS = REPORTS
#: what a run writes when no --format is given
DEFAULT_FORMATS = DEFAULT_REPORTS
#: every report format's writer, in the order they are written: one line a format
WRITERS: dict[str, Writer] = {
    "json": document.render,
    "junit": junit.render,
    "sarif": sarif.render,
    "html": html.render,
}


@dataclass
class Published:
    """The reports written, and what they say."""

    paths: dict[str, Path]  # format -> file
    verdict: Verdict
    data: RunData
    grouped: groups.Grouped


def publish(
    run_dir: Path,
    out: Path | None = None,
    formats: tuple[str, ...] | list[str] = DEFAULT_FORMATS,
    *,
    allow_empty: bool | None = None,
    stopped_by: str | None = None,
    log: RunLog | None = None,
) -> Published:
    """Write the reports of the run in ``run_dir`` and decide its verdict.

    Args:
        run_dir: a run folder (:class:`gpucheck.model.layout.RunFolder`), complete or not.
        out: where the HTML page goes (default ``run_dir/report.html``); the other formats
            always go into ``run_dir``.
        formats: which of :data:`FORMATS` to write (default :data:`DEFAULT_FORMATS`).
        allow_empty: see :func:`gpucheck.report.verdict.decide`.
        stopped_by: see :func:`gpucheck.report.verdict.decide`.
        log: the reader that already followed the run's results file (the controller's);
            None: the file is read (see :func:`gpucheck.report.rundata.load`).

    Returns:
        The paths written, the verdict, the run's data and its grouped findings.
    """
    unknown = [f for f in formats if f not in FORMATS or f not in WRITERS]
    if unknown:
        raise ValueError(f"unknown report format(s) {unknown}; known: {', '.join(FORMATS)}")
    run_dir = Path(run_dir)
    data = rundata.load(run_dir, log)
    report = Report.of(data, decide(data, allow_empty=allow_empty, stopped_by=stopped_by))
    elsewhere = {"html": Path(out)} if out is not None else {}  # what may go outside run_dir
    paths: dict[str, Path] = {}
    for fmt, writer in WRITERS.items():
        if fmt not in formats:
            continue
        path = elsewhere.get(fmt, run_dir / FORMATS[fmt])
        if fmt in elsewhere:
            path.parent.mkdir(parents=True, exist_ok=True)
        paths[fmt] = write_file(path, writer(report, path))
    ordered = {fmt: paths[fmt] for fmt in FORMATS if fmt in paths}
    return Published(ordered, report.verdict, data, report.grouped)


def warm() -> None:
    """What the first :func:`publish` of this process would do before it reads the run:
    compile the HTML page's templates (:func:`gpucheck.report.html.warm`)."""
    html.warm()


def write_all(
    run_dir: Path, out: Path | None = None, formats: tuple[str, ...] | list[str] = DEFAULT_FORMATS
) -> dict[str, Path]:
    """Write the reports of the run in ``run_dir`` (see :func:`publish`).

    Returns:
        ``{format: path}``, e.g. ``{"html": ..., "json": ..., "junit": ...}``.
    """
    return publish(run_dir, out, formats).paths
