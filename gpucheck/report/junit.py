"""JUnit XML from results.jsonl (what CI systems display).

One <testsuite> per (device, suite, mode); one <testcase> per record; failed -> <failure>,
error/crashed/hung -> <error> (with the kind in ``type``), skipped -> <skipped>; a case that
passed but carries a finding of severity error (a diagnosis such as wrong-device on a case
whose own assertions held) -> <failure type="finding">. A case whose failure a diagnosis
explains (:meth:`gpucheck.report.groups.Grouped.lead`: a tensor read as if contiguous behind
a failing assert) leads with it: the message is the diagnosis's, the test's own error follows
as its symptom. When the run's verdict does not pass but no case says so (nothing tested,
interrupted, incomplete), a last <testsuite name="gpucheck"> holds one failing
<testcase name="verdict"> with the reasons and the properties ``gpucheck.verdict`` and
``gpucheck.exit_code``: a CI that reads only junit.xml agrees with the command's exit code.
The format's writer is :func:`render`.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from gpucheck.model.results import CaseRecord
from gpucheck.model.runlog import RunLog
from gpucheck.report.groups import Grouped, build
from gpucheck.report.verdict import Verdict
from gpucheck.report.writer import Report

#: what XML 1.0 cannot hold (control characters, surrogates, U+FFFE/U+FFFF): a test id or
#: message with terminal escape codes or bytes that were not UTF-8 would make junit.xml
#: unreadable to the CI that parses it
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(value: object) -> str:
    """``value`` as text XML can hold: each character it cannot shown as ``\\xNN``."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def _describe(record: CaseRecord, grouped: Grouped) -> tuple[str, str]:
    """The message and text of a record's <failure>/<error>: the diagnosis that explains the
    case first (its message is the message), then the symptoms it explains, each said to be
    one (a failing assert, a CUDA error), then what no diagnosis explains."""
    reading = grouped.reading(record)
    lead = grouped.lead(record)
    first = next((f for place, f in reading if place == "lead"), None)
    if first is not None:
        message = f"{first.kind}: {first.message}"
        if record.reason:
            message += f" (symptom: {record.reason})"
    else:
        findings = record.findings
        message = record.reason or (findings[0].message if findings else record.status)
    parts = []
    for place, f in reading:
        intro = f"symptom of {lead.title()}: " if place == "symptom" and lead else ""
        parts.append(f"{intro}[{f.severity}] {f.kind}: {f.message}")
        if f.evidence:
            parts.append(f.evidence)
        if f.hint:
            parts.append(f"hint: {f.hint}")
    if record.stderr_tail:
        parts.append("stderr (tail):\n" + record.stderr_tail)
    return xml_text(message), xml_text("\n".join(parts))


def _verdict_suite(root: ET.Element, verdict: Verdict) -> dict[str, int]:
    ts = ET.SubElement(root, "testsuite", name="gpucheck", tests="1", time="0.000")
    props = ET.SubElement(ts, "properties")
    ET.SubElement(props, "property", name="gpucheck.verdict", value=verdict.name)
    ET.SubElement(props, "property", name="gpucheck.exit_code", value=str(verdict.exit_code))
    tc = ET.SubElement(ts, "testcase", classname="gpucheck", name="verdict", time="0.000")
    counts = {"tests": 1, "failures": 0, "errors": 1, "skipped": 0}
    ET.SubElement(
        tc, "error", message=f"verdict {verdict.name}", type=verdict.name
    ).text = xml_text("\n".join([*verdict.why, *verdict.problems]))
    for key, value in counts.items():
        ts.set(key, str(value))
    return counts


def to_xml(
    records: list[CaseRecord], verdict: Verdict | None = None, grouped: Grouped | None = None
) -> ET.ElementTree:
    """The JUnit XML of ``records`` (their diagnoses attached), with ``grouped`` their
    findings grouped (:func:`gpucheck.report.groups.build`; made here when not given)."""
    grouped = grouped if grouped is not None else build(records)
    groups: dict[tuple[str, str, str], list[CaseRecord]] = defaultdict(list)
    for r in records:
        groups[(r.device, r.suite, r.mode)].append(r)
    root = ET.Element("testsuites", name="gpucheck")
    totals: dict[str, int] = defaultdict(int)
    for (device, suite, mode), recs in sorted(groups.items()):
        counts = {"tests": len(recs), "failures": 0, "errors": 0, "skipped": 0}
        ts = ET.SubElement(root, "testsuite", name=xml_text(f"{suite} [{device}, {mode}]"))
        time_total = 0.0
        for r in recs:
            time_total += r.duration_s
            classname, _, name = r.case.rpartition("::")
            tc = ET.SubElement(
                ts,
                "testcase",
                classname=xml_text(f"{device}.{suite}.{classname}"),
                name=xml_text(name or r.case),
                time=f"{r.duration_s:.3f}",
            )
            status = r.status
            message, text = _describe(r, grouped)
            if status == "failed":
                counts["failures"] += 1
                ET.SubElement(tc, "failure", message=message, type="failed").text = text
            elif status in ("error", "crashed", "hung"):
                counts["errors"] += 1
                ET.SubElement(tc, "error", message=message, type=status).text = text
            elif status == "skipped":
                counts["skipped"] += 1
                ET.SubElement(tc, "skipped", message=message)
            elif r.errors():
                counts["failures"] += 1
                ET.SubElement(tc, "failure", message=message, type="finding").text = text
        for key, value in counts.items():
            ts.set(key, str(value))
            totals[key] += value
        ts.set("time", f"{time_total:.3f}")
    if verdict is not None and not verdict.ok and not totals["failures"] + totals["errors"]:
        for key, value in _verdict_suite(root, verdict).items():
            totals[key] += value
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(totals[key]))
    ET.indent(root)
    return ET.ElementTree(root)


def write(results_path: Path, junit_path: Path) -> Path:
    """Write JUnit XML for every case record of ``results_path`` (diagnoses attached)."""
    to_xml(RunLog.read(results_path).diagnosed_cases()).write(
        junit_path, encoding="utf-8", xml_declaration=True
    )
    return junit_path


def render(report: Report, path: Path) -> bytes:
    """junit.xml of a run."""
    out = io.BytesIO()
    to_xml(report.data.cases, report.verdict, report.grouped).write(
        out, encoding="utf-8", xml_declaration=True
    )
    return out.getvalue()
