"""Results of a run: the results.jsonl format, its JSON Schema, and the reports made from it.

``write_all(run_dir)`` (re)writes every report of a run folder from what it holds:
``report.html`` (one self-contained page), ``results.json`` (one JSON document, see
``document``) and ``junit.xml``. It works on an interrupted run too (torn last line, no header,
no timeline) and never raises on the folder's content.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpucheck.report import document, html, junit, rundata, timeline


def _write(path: Path, text: str) -> Path:
    """Write through a temporary file: a reader never sees half a report."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def write_all(run_dir: Path, out: Path | None = None) -> dict[str, Path]:
    """Write report.html, results.json and junit.xml of the run in ``run_dir``.

    Args:
        run_dir: a run folder (results.jsonl, nvml_timeline.jsonl, workers/), complete or not.
        out: where the HTML page goes (default ``run_dir/report.html``); results.json and
            junit.xml always go into ``run_dir``.

    Returns:
        ``{"html": path, "json": path, "junit": path}``.
    """
    run_dir = Path(run_dir)
    html_path = Path(out) if out is not None else run_dir / "report.html"
    data = rundata.load(run_dir)
    tl = timeline.read(run_dir / "nvml_timeline.jsonl", data.uuid_labels())
    if tl is not None and tl.torn:
        data.problems.append(f"{tl.torn} line(s) of nvml_timeline.jsonl could not be read")
    doc = document.build(data, tl)
    paths = {
        "json": _write(run_dir / "results.json",
                       json.dumps(doc, separators=(",", ":"), default=str) + "\n"),
        "junit": run_dir / "junit.xml",
    }
    tree = junit.to_xml(data.cases)
    tmp = run_dir / ".junit.xml.tmp"
    tree.write(tmp, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, paths["junit"])
    html_path.parent.mkdir(parents=True, exist_ok=True)
    paths["html"] = _write(html_path, html.render(data, doc, tl, html_path))
    return paths
