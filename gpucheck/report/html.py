"""``report.html``: one self-contained page (inline CSS, JS and SVG; no fetch of any kind).

The page is rendered from the jinja2 templates beside this module. What a maintainer looks at
first is rendered on the server side: the verdict, the device x suite matrix, every case that
did not pass, every finding with its evidence and a hint, the NVML timelines. Cases that passed
or were skipped are only counted in the page and listed on demand from an embedded JSON table
(a run of 40,000 cases stays a page of a few MB that opens in about a second). It is
rendered from the run's :class:`~gpucheck.report.writer.Report` (:func:`render`, the format's
writer), never from another format's document.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import jinja2

from gpucheck.model.results import BAD_STATUSES, CaseRecord
from gpucheck.model.runlog import RunHeader
from gpucheck.report import cards, evidence
from gpucheck.report import plots as plots_mod
from gpucheck.report.rundata import EXTRA_TITLES, RunData
from gpucheck.report.summary import SEVERITY_ORDER, Cell, Summary
from gpucheck.report.timeline import BUCKETS
from gpucheck.report.writer import Report

#: rows of the cross-device comparison
MAX_COMPARE = 100
STATUS_CHAR = {s: s[0] for s in SEVERITY_ORDER}


class _TemplateCache(jinja2.FileSystemBytecodeCache):
    """The compiled templates kept between runs, jinja's own cache (a folder of the user's
    in the temporary directory, each entry checked against its template's source), so a run
    does not compile them again; a cache that cannot be written costs a compile, never the
    report."""

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def _template_cache() -> jinja2.BytecodeCache | None:
    try:
        return _TemplateCache()
    except (OSError, RuntimeError):  # no private folder of the user's in the temporary one
        return None


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("gpucheck.report", "templates"),
    autoescape=True,
    trim_blocks=True,
    lstrip_blocks=True,
    undefined=jinja2.StrictUndefined,
    bytecode_cache=_template_cache(),
)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {sec:02d} s"


def _peak(record: CaseRecord) -> int | None:
    mem = record.memory
    return mem.torch_peak_allocated if mem.torch_peak_allocated is not None else mem.nvml_peak_used


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x"


def _header(data: RunData, s: Summary, plots: list[dict[str, Any]]) -> dict[str, Any]:
    h = data.header if data.header is not None else RunHeader(run_id="")
    peaks = {p["label"]: p["used_peak"] for p in plots}
    gpus = [
        {
            "device": d.device,
            "name": d.name or "unknown",
            "uuid": d.uuid or "n/a",
            "memory": evidence.fmt_bytes(d.memory_total),
            "peak": peaks.get(d.device, "n/a"),
        }
        for d in h.devices
    ]
    rows = [
        ("started", s.started_at or "unknown"),
        ("took", _duration(s.duration_s)),
        ("host", h.field("host", "hostname") or "not recorded"),
        ("driver", h.field("driver_version") or "not recorded"),
        ("CUDA", h.field("cuda_version", "cuda_driver_version") or "not recorded"),
        ("torch", h.field("torch_version") or "not recorded"),
        ("gpucheck", h.field("gpucheck_version") or "not recorded"),
        ("modes", ", ".join(s.modes) or "none recorded"),
        ("suites", ", ".join(s.suites) or "none recorded"),
        ("command", " ".join(h.command) or "not recorded"),
        ("run id", data.run_id or "unknown"),
        ("CUDA_VISIBLE_DEVICES", h.field("cuda_visible_devices")),
    ]
    return {"rows": [(k, str(v)) for k, v in rows if v is not None], "gpus": gpus, "notes": h.notes}


def _cell_groups(data: RunData) -> list[tuple[str, str, str, list[int]]]:
    """(cell id, device, suite, case indices) of every (device, suite) with cases."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, r in enumerate(data.cases):
        groups[(r.device, r.suite)].append(i)
    ordered = sorted(
        groups.items(), key=lambda kv: (data.devices.index(kv[0][0]), data.suites.index(kv[0][1]))
    )
    return [
        (f"cell-{n}-{_slug(device)}-{_slug(suite)}", device, suite, indices)
        for n, ((device, suite), indices) in enumerate(ordered)
    ]


def _cells(
    data: RunData, card_of_case: dict[int, str], groups: list[tuple[str, str, str, list[int]]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Case lists per (device, suite): rows of cases that did not pass, and the JSON table of
    the others (listed on demand)."""
    names: dict[str, int] = {}
    modes: dict[str, int] = {}
    cells, lazy = [], {}
    for cell_id, device, suite, indices in groups:
        rows, quiet = [], []
        counts: dict[str, int] = defaultdict(int)
        for i in indices:
            r = data.cases[i]
            counts[r.status] += 1
            kinds = sorted({f.kind for f in r.findings})
            if r.status in ("passed", "skipped") and not kinds:
                quiet.append(
                    [
                        names.setdefault(r.case, len(names)),
                        modes.setdefault(r.mode, len(modes)),
                        STATUS_CHAR[r.status],
                        round(r.duration_s, 3),
                        _peak(r),
                        r.reason,
                    ]
                )
                continue
            rows.append(
                {
                    "status": r.status,
                    "case": r.case,
                    "mode": r.mode,
                    "duration": f"{r.duration_s:.2f}",
                    "peak": evidence.fmt_bytes(_peak(r)),
                    "reason": r.reason or "",
                    "kinds": " ".join(kinds),
                    "card": card_of_case.get(i),
                }
            )
        if quiet:
            lazy[cell_id] = quiet
        cells.append(
            {
                "id": cell_id,
                "device": device,
                "suite": suite,
                "rows": rows,
                "quiet": len(quiet),
                "counts": dict(counts),
            }
        )
    table = {
        "names": list(names),
        "modes": list(modes),
        "cells": lazy,
        "device_of": {c["id"]: c["device"] for c in cells},
    }
    return cells, table


def _matrix(data: RunData, matrix: list[Cell], cells: list[dict[str, Any]]) -> dict[str, Any]:
    ids = {(c["device"], c["suite"]): c["id"] for c in cells}
    by = {(m.device, m.suite): m for m in matrix}
    rows = []
    for device in data.devices:
        row = []
        for suite in data.suites:
            m = by.get((device, suite))
            if m is None:
                row.append({"worst": "empty", "text": "no cases", "href": None, "title": ""})
                continue
            counts = m.counts
            bad = sum(v for k, v in counts.items() if k in BAD_STATUSES)
            text = f"{bad} not passed" if bad else f"{counts.get('passed', 0)} passed"
            title = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
            row.append(
                {
                    "worst": m.worst,
                    "text": text,
                    "title": title,
                    "href": "#" + ids[(device, suite)],
                    "counts": title,
                }
            )
        rows.append({"device": device, "cells": row})
    return {"suites": data.suites, "rows": rows}


def _natural(label: str) -> list[Any]:
    """``rank2/cpu`` before ``rank10/cpu``."""
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", label)]


def _compare(data: RunData) -> dict[str, Any]:
    """Time and peak memory of each case on each device; the cases that differ most first.

    Only cases that ran on two or more devices are compared, on the devices they ran on: the
    ranks of a distributed pass with each other, never with the device of another pass (the
    ``cpu`` of ``--cpu-only`` against ``rank0/cpu``). Where no case ran on two devices, the
    slowest cases are listed instead."""
    per: dict[tuple[str, str, str], dict[str, CaseRecord]] = defaultdict(dict)
    for r in data.cases:
        if r.status != "skipped":
            per[(r.suite, r.case, r.mode)][r.device] = r
    if any(len(by_dev) > 1 for by_dev in per.values()):
        per = defaultdict(dict, {k: v for k, v in per.items() if len(v) > 1})
    used = {d for by_dev in per.values() for d in by_dev}
    listed = [d.device for d in data.header.devices] if data.header else []
    devices = [d for d in listed if d in used] + sorted(  # ranks in rank order, not as
        (d for d in used if d not in listed), key=_natural
    )  # their records came in
    rows: list[dict[str, Any]] = []
    for (suite, case, mode), by_dev in per.items():
        times = [r.duration_s for r in by_dev.values()]
        peaks = [p for p in (_peak(r) for r in by_dev.values()) if p is not None]
        spread_t = max(times) / max(min(times), 1e-3) if len(times) > 1 else 1.0
        spread_m = max(peaks) / max(min(peaks), 1) if len(peaks) > 1 else 1.0
        med_t = statistics.median(times) if times else 0.0
        cells: list[dict[str, Any] | None] = []
        for d in devices:
            found = by_dev.get(d)
            if found is None:
                cells.append(None)
                continue
            t = found.duration_s
            cells.append(
                {
                    "time": f"{t:.3f} s",
                    "peak": evidence.fmt_bytes(_peak(found)),
                    "status": found.status,
                    "slow": len(by_dev) > 1 and t > 1.5 * med_t and t - med_t > 0.05,
                }
            )
        rows.append(
            {
                "suite": suite,
                "case": case,
                "mode": mode,
                "cells": cells,
                "spread": max(spread_t, spread_m),
                "max_time": max(times),
                "spread_text": f"{spread_t:.1f}x time, {spread_m:.1f}x memory",
            }
        )
    multi = len(devices) > 1
    rows.sort(key=lambda r: -float(r["spread"] if multi else r["max_time"]))
    return {"devices": devices, "rows": rows[:MAX_COMPARE], "total": len(rows), "multi": multi}


def _extras(data: RunData) -> list[dict[str, Any]]:
    out = []
    for kind, records in data.extras.items():
        columns = [
            c
            for c in dict.fromkeys(k for r in records for k in r)
            if c not in ("schema", "record", "run_id")
        ]
        rows = [[evidence.fmt_value(r.get(c, "")) for c in columns] for r in records]
        out.append(
            {
                "title": EXTRA_TITLES.get(kind, kind.replace("_", " ").capitalize()),
                "columns": columns,
                "rows": rows,
            }
        )
    return out


def _logs(data: RunData, out: Path) -> list[dict[str, str]]:
    base = out.resolve().parent
    return [
        {"name": p.name, "href": Path(os.path.relpath(p.resolve(), base)).as_posix()}
        for p in data.logs
    ]


def _json_script(value: Any) -> str:
    """JSON for a <script type="application/json"> block (no '</script>' can close it)."""
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def warm() -> None:
    """Compile the page's templates now (jinja keeps them): a controller does it while its
    workers run, so that the page is only rendered at the run's end."""
    for name in _ENV.list_templates(extensions=["j2"]):
        _ENV.get_template(name)


def _timeline(data: RunData) -> dict[str, Any] | None:
    """How the NVML timeline was sampled (None: the run has none)."""
    tl = data.timeline
    if tl is None:
        return None
    return {
        "samples": tl.samples,
        "interval_s": None if tl.interval_s is None else round(tl.interval_s, 4),
    }


def render(report: Report, path: Path) -> str:
    """The HTML page of a run (``path`` is where it will be written: links are relative)."""
    t0 = time.perf_counter()
    data, verdict, s = report.data, report.verdict, report.summary
    plots = plots_mod.plots(data)
    cell_groups = _cell_groups(data)
    cell_of = {i: cell_id for cell_id, _, _, indices in cell_groups for i in indices}
    findings, card_of_case = cards.sections(data, report.grouped, cell_of)
    cells, table = _cells(data, card_of_case, cell_groups)
    ctx = {
        "summary": s,
        "generated_at": report.generated_at,
        "run_dir": str(data.run_dir),
        "run_id": data.run_id or "(unknown)",
        "verdict": verdict.name,
        "why": verdict.why,
        "interrupted": data.interrupted,
        "problems": data.problems,
        "header": _header(data, s, plots),
        "matrix": _matrix(data, report.matrix, cells),
        "cells": cells,
        "findings": findings,
        "plots": plots,
        "timeline": _timeline(data),
        "buckets": BUCKETS,
        "compare": _compare(data),
        "extras": _extras(data),
        "logs": _logs(data, path),
        "statuses": [st for st in SEVERITY_ORDER if s.by_status.get(st)],
        "kinds": list(dict.fromkeys(b["kind"] for sec in findings for b in sec["kinds"])),
        "severities": [sv for sv in ("error", "warning", "info") if s.by_severity.get(sv)],
        "data_json": _json_script(table),
        "title": f"gpucheck {verdict.name}: {data.run_id or data.run_dir.name}",
    }
    page = _ENV.get_template("report.html.j2").render(**ctx)
    return page.replace("@@RENDER_MS@@", f"{(time.perf_counter() - t0) * 1000:.0f}")
