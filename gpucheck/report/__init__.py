"""Results of a run: the results.jsonl format, its JSON Schema, and the reports made from it.

``publish(run_dir)`` (re)writes the reports of a run folder from what it holds and returns
them with the run's verdict (:mod:`gpucheck.report.verdict`, the one rule every output
states): ``report.html`` (one self-contained page), ``results.json`` (one JSON document, see
``document``), ``junit.xml`` and, when asked, ``results.sarif`` (SARIF 2.1.0, see ``sarif``).
It works on an interrupted run too (torn last line, no header, no timeline) and never raises
on the folder's content. ``write_all`` is the same, returning only the paths.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpucheck.model.layout import DEFAULT_REPORTS, REPORTS
from gpucheck.model.runlog import RunLog
from gpucheck.report import document, groups, html, junit, rundata, sarif
from gpucheck.report.rundata import RunData
from gpucheck.report.verdict import Verdict, decide

#: every report format: name -> file in the run folder
FORMATS = REPORTS
#: what a run writes when no --format is given
DEFAULT_FORMATS = DEFAULT_REPORTS


@dataclass
class Published:
    """The reports written, and what they say."""

    paths: dict[str, Path]  # format -> file
    verdict: Verdict
    data: RunData
    grouped: groups.Grouped


def _write(path: Path, write: str | Callable[[BinaryIO], None]) -> Path:
    """Write through a fresh temporary file beside ``path`` (created, never opened through a
    link a folder someone else made may hold), then put it in place: a reader never sees half
    a report, and nothing outside the folder is written."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:  # name the report, not the temporary file
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(write, str):
                f.write(write.encode("utf-8"))
            else:
                write(f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):  # name the report, not the temporary file
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise
    return path


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
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"unknown report format(s) {unknown}; known: {', '.join(FORMATS)}")
    run_dir = Path(run_dir)
    data = rundata.load(run_dir, log)
    verdict = decide(data, allow_empty=allow_empty, stopped_by=stopped_by)
    grouped = groups.build(data.cases)
    doc = document.build(data, verdict, grouped)
    paths: dict[str, Path] = {}
    if "json" in formats:
        paths["json"] = _write(
            run_dir / FORMATS["json"], json.dumps(doc, separators=(",", ":"), default=str) + "\n"
        )
    if "junit" in formats:
        tree = junit.to_xml(data.cases, verdict, grouped)
        paths["junit"] = _write(
            run_dir / FORMATS["junit"],
            lambda f: tree.write(f, encoding="utf-8", xml_declaration=True),
        )
    if "sarif" in formats:
        paths["sarif"] = _write(
            run_dir / FORMATS["sarif"],
            json.dumps(sarif.build(data, grouped, verdict), indent=1, default=str) + "\n",
        )
    if "html" in formats:
        html_path = Path(out) if out is not None else run_dir / FORMATS["html"]
        html_path.parent.mkdir(parents=True, exist_ok=True)
        paths["html"] = _write(html_path, html.render(data, doc, html_path, grouped, verdict))
    ordered = {fmt: paths[fmt] for fmt in FORMATS if fmt in paths}
    return Published(ordered, verdict, data, grouped)


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
