"""``results.json``: the whole run as one JSON document (what a script or a dashboard reads).

Shape (``schema: gpucheck.report/1``)::

    {
      "schema": "gpucheck.report/1",
      "generated_at": ISO time, "run_dir": str,
      "run": the run header record of results.jsonl, or null when the run has none,
      "state": {"complete": bool (a header, not interrupted, every line read, every planned
                case recorded: no shard missing), "interrupted": [why, ...],
                "problems": [note, ...]},
      "summary": {"verdict": "passed" | "warnings" | "failed" | "interrupted" |
                             "incomplete" | "nothing-tested"   (see ``verdict``),
                  "exit_code": int, "why": [sentence, ...],
                  "started_at", "finished_at": ISO or null, "duration_s": float or null,
                  "devices": [label], "suites": [name], "modes": [label],
                  "cases": int, "by_status": {status: n}, "findings": int,
                  "by_kind": {kind: n}, "by_severity": {severity: n}},
      "matrix": [{"device", "suite", "worst": status, "counts": {status: n}}],
      "diagnoses": [group], "symptoms": [group]   (see ``groups``: one group per
                   (kind, op or kernel); a diagnosis lists the symptoms it explains; the
                   symptoms are those no diagnosis explains),
      "findings": {kind: [finding + {"mode", "status", "case_index"}]},
      "cases": [every case record of the run, as read (results.schema.json's case)],
      "timeline": null or {"file", "samples", "interval_s", "start", "end", "devices": [
                   {"label", "uuid", "nvml_index", "peak_used",
                    "processes": {pid: {"peak": bytes, "devices": [label]}}}]},
      "extras": {record type: [records]}   (checkpoint lint, benchmarks, ...)
    }

``case_index`` is the finding's case in ``cases``. Field order and names of case records and
findings are those of results.schema.json. The JSON Schema of the document ships as
``gpucheck/model/report.schema.json`` (:func:`schema`). The format's writer is :func:`render`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpucheck.model.layout import TIMELINE
from gpucheck.report.rundata import RunData
from gpucheck.report.summary import iso
from gpucheck.report.timeline import Timeline
from gpucheck.report.writer import Report

SCHEMA = "gpucheck.report/1"


def schema() -> dict[str, Any]:
    """The JSON Schema of results.json (``gpucheck/model/report.schema.json``)."""
    from importlib import resources

    text = resources.files("gpucheck.model").joinpath("report.schema.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def findings_by_kind(data: RunData) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for i, r in enumerate(data.cases):
        for f in r.findings:
            out[f.kind].append(
                {
                    **asdict(f),
                    "device": f.device or r.device,
                    "suite": f.suite or r.suite,
                    "case": f.case or r.case,
                    "mode": r.mode,
                    "status": r.status,
                    "case_index": i,
                }
            )
    return dict(sorted(out.items()))


def timeline_summary(tl: Timeline | None) -> dict[str, Any] | None:
    if tl is None:
        return None
    pid_devices = tl.pid_devices()
    return {
        "file": TIMELINE,
        "samples": tl.samples,
        "interval_s": None if tl.interval_s is None else round(tl.interval_s, 4),
        "start": iso(tl.t0),
        "end": iso(tl.t1),
        "devices": [
            {
                "label": d.label,
                "uuid": d.uuid,
                "nvml_index": d.nvml_index,
                "peak_used": d.used.peak,
                "processes": {
                    pid: {"peak": s.peak, "devices": pid_devices[pid]}
                    for pid, s in d.processes.items()
                },
            }
            for d in tl.devices
        ],
    }


def build(report: Report) -> dict[str, Any]:
    """The results.json document of a run."""
    data = report.data
    interrupted = data.interrupted
    return {
        "schema": SCHEMA,
        "generated_at": report.generated_at,
        "run_dir": str(data.run_dir),
        "run": data.header.raw if data.header else None,
        "state": {
            "complete": data.header is not None
            and not interrupted
            and not data.torn_lines
            and not data.missing,
            "interrupted": interrupted,
            "problems": data.problems,
        },
        "summary": report.summary.to_json(),
        "matrix": [c.to_json() for c in report.matrix],
        **report.grouped.to_json(),
        "findings": findings_by_kind(data),
        "cases": [r.to_json() for r in data.cases],
        "timeline": timeline_summary(data.timeline),
        "extras": data.extras,
    }


def render(report: Report, path: Path) -> str:
    """results.json: the document, compact."""
    return json.dumps(build(report), separators=(",", ":"), default=str) + "\n"
