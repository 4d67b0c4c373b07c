"""``results.sarif``: the findings as SARIF 2.1.0, the format code hosts annotate source with.

One result per distinct finding: a (kind, op or kernel) group of :mod:`gpucheck.report.groups`
split by message (addresses blanked) and place; how often, on which devices, in which modes
and cases go into the result's ``properties``. The place is, in this order:

* a compute-sanitizer record's source line (``ssim_backward.cu:73``), with the Python frame of the
  case that launched it (``test_selftest.py:64``) as a related location;
* otherwise the case's test file (its suite folder + the case id's file part), at the line
  the finding's traceback or message names in that file (``test_x.py:41: AssertionError``,
  ``all_reduce #2 at test_dist_defects.py:27``), or the file alone.

Paths under ``base`` (the current folder by default: run gpucheck from the repository root)
are written relative to it with ``uriBaseId`` ``%SRCROOT%``, which is what code hosts
resolve; other paths as ``file://`` URIs. A sanitizer record names a source file without its
folder (``ssim_backward.cu``): it is looked up under ``base`` (hidden folders, virtual
environments and ``reports`` skipped) and written as the one file of that name, the one
closest to the case's suite when there are several, or as the bare name when there is none.
The rules are the finding kinds. A diagnosis's result lists the symptoms it explains in
``properties.explains`` and places them (a failing assert's line) among its related
locations; the result of each symptom it explains says so first (``symptom of memory-layout
X._C.fn: AssertionError ...``) and names it in ``properties.explainedBy``. The invocation
carries the run's verdict and exit code, with the verdict's reasons as notifications. The
format's writer is :func:`render`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import gpucheck
from gpucheck.model import clock
from gpucheck.model.results import CaseRecord
from gpucheck.model.runlog import RunHeader
from gpucheck.report import evidence
from gpucheck.report.groups import Group, Grouped, Occurrence, signature
from gpucheck.report.rundata import RunData
from gpucheck.report.verdict import Verdict
from gpucheck.report.writer import Report
from gpucheck.sanitizer.findings import SANITIZER

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
VERSION = "2.1.0"
LEVELS = {"error": "error", "warning": "warning", "info": "note"}
SRCROOT = "%SRCROOT%"
#: ``file.py:12`` in a traceback, a message or a sanitizer's Python frame
_PY_LINE = re.compile(r"([\w./\\-]+\.py):(\d+)")
#: ``ssim_backward.cu:73``
_SRC_LINE = re.compile(r"^(.+):(\d+)$")

#: folders never searched for a source file
SKIP_DIRS = ("node_modules", "reports", "site-packages", "__pycache__", "build", "dist")
#: files looked at, at most, when searching for source files by name
MAX_FILES = 50_000

Location = tuple[str, int | None]  # path as recorded (absolute, relative or a bare name), line


class _Sources:
    """Files under ``base`` by name, read once on first use (bounded: :data:`MAX_FILES`)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.by_name: dict[str, list[str]] | None = None

    def _index(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        seen = 0
        for root, dirs, files in os.walk(self.base):
            dirs[:] = sorted(
                d
                for d in dirs
                if not d.startswith(".")
                and d not in SKIP_DIRS
                and not (Path(root) / d / "pyvenv.cfg").exists()
            )
            for name in files:
                found.setdefault(name, []).append(os.path.join(root, name))
            seen += len(files)
            if seen > MAX_FILES:
                break
        return found

    def find(self, name: str, near: str | None) -> str:
        """The path of the one file called ``name``, or ``name`` itself."""
        if "/" in name or "\\" in name:
            return name
        if self.by_name is None:
            self.by_name = self._index()
        paths = self.by_name.get(name, [])
        if len(paths) > 1 and near:
            return max(paths, key=lambda p: len(os.path.commonpath([p, near])))
        return paths[0] if paths else name


def _case_file(record: CaseRecord, suite_paths: dict[str, str]) -> str | None:
    """The test file of a case: its suite folder joined with the case id's file part."""
    file = record.case.split("::")[0]
    if not file.endswith(".py"):
        return None
    root = suite_paths.get(record.suite)
    return str(Path(root) / file) if root else file


def _line_in(file: str, *texts: Any) -> int | None:
    """The line of ``file`` that a traceback or message names (the last mention wins: a
    pytest traceback ends in the test's own frame)."""
    name = PurePosixPath(file.replace("\\", "/")).name
    line = None
    for text in texts:
        for m in _PY_LINE.finditer(str(text or "")):
            if PurePosixPath(m[1].replace("\\", "/")).name == name:
                line = int(m[2])
    return line


def _places(
    o: Occurrence, suite_paths: dict[str, str], sources: _Sources
) -> tuple[Location | None, list[Location]]:
    """The primary location of one occurrence and its related ones."""
    f, r = o.finding, o.record
    case_file = _case_file(r, suite_paths)
    case_loc = (
        None if case_file is None else (case_file, _line_in(case_file, f.evidence, f.message))
    )
    related: list[Location] = []
    if f.kind == SANITIZER.name:
        parsed = o.sanitizer
        if parsed is not None and parsed.python_frame:
            m = _PY_LINE.search(parsed.python_frame)
            if m:
                frame = (m[1], int(m[2]))
                if case_file and PurePosixPath(m[1]).name == PurePosixPath(case_file).name:
                    frame = (case_file, int(m[2]))
                related.append(frame)
        m = _SRC_LINE.match(str(parsed.source)) if parsed is not None and parsed.source else None
        if m:
            if case_loc is not None:
                related.append(case_loc)
            return (sources.find(m[1], case_file), int(m[2])), related
    return case_loc, related


def _uri(path: str, base: Path) -> tuple[str, str | None]:
    """(uri, uriBaseId) of a recorded path."""
    p = Path(path)
    if p.is_absolute():
        try:
            return quote(p.resolve().relative_to(base.resolve()).as_posix()), SRCROOT
        except ValueError:
            pass
        # recorded on another machine (a GPU runner's checkout): the same file under base,
        # found by the longest tail of its path that exists there
        for i in range(1, len(p.parts) - 1):
            tail = Path(*p.parts[i:])
            if (base / tail).is_file():
                return quote(tail.as_posix()), SRCROOT
        return p.resolve().as_uri(), None
    return quote(
        PurePosixPath(path.replace("\\", "/")).as_posix()
    ), SRCROOT if "/" in path else None


def _physical(loc: Location, base: Path) -> dict[str, Any]:
    uri, base_id = _uri(loc[0], base)
    artifact: dict[str, Any] = {"uri": uri}
    if base_id:
        artifact["uriBaseId"] = base_id
    physical: dict[str, Any] = {"artifactLocation": artifact}
    if loc[1]:
        physical["region"] = {"startLine": loc[1]}
    return {"physicalLocation": physical}


def _rules(groups: list[Group]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    kinds: dict[str, Group] = {}
    for g in groups:
        kinds.setdefault(g.kind, g)
    rules, index = [], {}
    for n, (kind, g) in enumerate(kinds.items()):
        index[kind] = n
        rule: dict[str, Any] = {
            "id": kind,
            "name": evidence.kind_title(kind),
            "shortDescription": {"text": evidence.kind_title(kind)},
            "help": {"text": evidence.kind_hint(kind)},
            "defaultConfiguration": {"level": LEVELS.get(g.severity, "warning")},
            "properties": {"role": g.role},
        }
        if evidence.kind_about(kind):
            rule["fullDescription"] = {"text": evidence.kind_about(kind)}
        rules.append(rule)
    return rules, index


def _results(
    g: Group,
    rule_index: dict[str, int],
    suite_paths: dict[str, str],
    sources: _Sources,
    explained_by: Group | None,
) -> list[dict[str, Any]]:
    base = sources.base
    split: dict[tuple[str, Location | None], list[tuple[Occurrence, list[Location]]]] = {}
    for o in g.occurrences:
        primary, related = _places(o, suite_paths, sources)
        split.setdefault((signature(o.finding.message), primary), []).append((o, related))
    out = []
    for (message, primary), occ in split.items():
        first = occ[0][0].finding
        devices = sorted({o.record.device for o, _ in occ})
        cases = list(dict.fromkeys(o.record.case for o, _ in occ))
        text = message.splitlines()[0] if message else first.kind
        text += (
            f" ({len(occ)} occurrence(s) on {', '.join(devices)}; "
            f"case(s): {', '.join(cases[:5])}{' ...' if len(cases) > 5 else ''})"
        )
        result: dict[str, Any] = {
            "ruleId": g.kind,
            "ruleIndex": rule_index[g.kind],
            "level": LEVELS.get(first.severity, "warning"),
            "message": {"text": text},
            "partialFingerprints": {
                "gpucheckFinding/v1": hashlib.sha256(
                    f"{g.kind}|{g.subject}|{message}|{primary}".encode()
                ).hexdigest()[:32]
            },
            "properties": {
                "role": g.role,
                "subject": g.subject,
                "count": len(occ),
                "devices": devices,
                "modes": sorted({o.record.mode for o, _ in occ}),
                "statuses": sorted({o.record.status for o, _ in occ}),
                "cases": cases,
                "hint": evidence.hint_for(first),
            },
        }
        if explained_by is not None:
            result["properties"]["explainedBy"] = explained_by.title()
            result["message"]["text"] = f"symptom of {explained_by.title()}: {text}"
        if primary is not None:
            result["locations"] = [_physical(primary, base)]
        linked: list[dict[str, Any]] = [
            _physical(loc, base) for loc in dict.fromkeys(loc for _, rel in occ for loc in rel)
        ]
        explains = _symptoms(g, {o.case_key for o, _ in occ}, suite_paths, sources)
        if explains:
            result["properties"]["explains"] = [m for _, m in explains]
            linked += [
                {**_physical(loc, base), "message": {"text": m}} for loc, m in explains if loc
            ]
        if linked:
            result["relatedLocations"] = [{"id": n, **r} for n, r in enumerate(linked)]
        out.append(result)
    return out


def _symptoms(
    g: Group, cases: set[tuple[str, str, str]], suite_paths: dict[str, str], sources: _Sources
) -> list[tuple[Location | None, str]]:
    """The symptoms a diagnosis explains in ``cases`` (its result's), each once: where it
    is (a failing assert's line) and ``symptom: <kind>: <first line of its message>``."""
    found: dict[tuple[Location | None, str], None] = {}
    for e in g.explains:
        for o in e.occurrences:
            if o.case_key in cases:
                first = (signature(o.finding.message).splitlines() or [""])[0]
                found[(_places(o, suite_paths, sources)[0], f"symptom: {e.kind}: {first}")] = None
    return list(found)


def _utc(t: float | None) -> str | None:
    if t is None:
        return None
    return clock.iso(t, "microseconds").replace("+00:00", "Z")  # SARIF's form of UTC


def build(
    data: RunData, grouped: Grouped, verdict: Verdict, base: Path | None = None
) -> dict[str, Any]:
    """The SARIF log of a run.

    Args:
        data: the run folder, as read by :func:`gpucheck.report.rundata.load`.
        grouped: its findings, grouped (:func:`gpucheck.report.groups.build`).
        verdict: its verdict (:func:`gpucheck.report.verdict.decide`).
        base: the folder relative paths are written against (default: the current folder).

    Returns:
        The SARIF 2.1.0 log as a JSON-ready dict.
    """
    base = Path.cwd() if base is None else base
    header = data.header if data.header is not None else RunHeader(run_id="")
    suite_paths = header.config.suite_paths
    every = [
        *grouped.diagnoses,
        *(e for g in grouped.diagnoses for e in g.explains),
        *grouped.symptoms,
    ]
    rules, rule_index = _rules(every)
    sources = _Sources(base)
    found: list[dict[str, Any]] = []
    for g in grouped.diagnoses:
        found += _results(g, rule_index, suite_paths, sources, None)
        for e in g.explains:
            found += _results(e, rule_index, suite_paths, sources, g)
    for g in grouped.symptoms:
        found += _results(g, rule_index, suite_paths, sources, None)
    invocation: dict[str, Any] = {
        "executionSuccessful": verdict.ok,
        "exitCode": verdict.exit_code,
        "properties": {"verdict": verdict.name},
    }
    if header.command:
        invocation["commandLine"] = " ".join(header.command)
    for key, t in (("startTimeUtc", data.started()), ("endTimeUtc", data.finished())):
        if _utc(t):
            invocation[key] = _utc(t)
    notes = [
        {"level": "error" if not verdict.ok else "note", "message": {"text": why}}
        for why in verdict.why
    ] + [{"level": "error", "message": {"text": p}} for p in verdict.problems]
    if notes:
        invocation["toolExecutionNotifications"] = notes
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "gpucheck",
                "version": gpucheck.__version__,
                "semanticVersion": gpucheck.__version__,
                "rules": rules,
            }
        },
        "originalUriBaseIds": {SRCROOT: {"uri": base.resolve().as_uri() + "/"}},
        "invocations": [invocation],
        "results": found,
        "properties": {
            "verdict": verdict.name,
            "run_id": data.run_id,
            "devices": data.devices,
            "started": _utc(clock.parse(header.started_at)),
        },
    }
    return {"$schema": SCHEMA_URI, "version": VERSION, "runs": [run]}


def render(report: Report, path: Path) -> str:
    """results.sarif of a run (its paths relative to the current folder)."""
    return (
        json.dumps(build(report.data, report.grouped, report.verdict), indent=1, default=str) + "\n"
    )
