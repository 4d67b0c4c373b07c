"""Findings as a maintainer reads them: diagnoses first, each with the symptoms it explains.

A *diagnosis* names a cause: a detector that knows what went wrong made it (``wrong-device``,
``wrong-stream``, ``device-state-leak``, ``mixed-devices`` (a call's tensor arguments on two
devices: it explains the CUDA error of its case), ``double-activation``, ``oom-anomaly``,
``leak``, ``memory-growth``, ``stray-context``, ``numerics`` that found a non-deterministic or
cross-device result, ``unwritten-output``, ``memory-layout`` (a call whose result depends on
its arguments' layout), and the sanitizer records traced to the op that launched their kernel
(``data-race``, ``out-of-bounds``), the distributed watchdog's ``collective-mismatch``,
``rank-crash``..., and any kind a user's detector attaches). A *symptom* is what a failure
looks like from outside: a ``crash``, a ``hang``, a ``cuda-error``, a raw ``sanitizer``
record, a ``test-failure``, an ``oom``, a ``numerics`` mismatch against the reference.

Findings are grouped by (kind, subject): the subject is the op the finding names, or the
kernel (a sanitizer record's kernel first: its op is the Python call, its kernel the bug).
One group holds every case, device and mode it occurred on. A symptom on a case (device,
suite, case; any mode) that has a diagnosis of severity error is folded under that diagnosis:
the wrong-device diagnosis of ``test_x[cuda1]`` explains its crash, its CUDA error and the
memcheck records of the same case. Where several diagnoses fire on one case, the root cause
takes its symptoms (:func:`precedence`: a guard before a stream before a leak). The symptoms
no diagnosis explains are grouped the same way. Every format leads a case with its diagnosis
(:meth:`Grouped.lead`, :meth:`Grouped.reading`, :func:`in_order`) and lists the case's own
failure as its symptom.

Which kinds are diagnoses, which symptoms, and their places among the root causes are
declared by the detectors and the other makers of findings (:mod:`gpucheck.model.kinds`,
collected by :func:`gpucheck.detectors.registry.kinds`); nothing here names a kind.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gpucheck.model.kinds import DIAGNOSIS, SYMPTOM, Kinds, Role
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.sanitizer.findings import SANITIZER, read_back
from gpucheck.sanitizer.parser import SanitizerFinding

SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_DIGITS = re.compile(r"(\d+)")


def natural(label: str) -> list[Any]:
    """Sort key: cuda:2 before cuda:10, rank2/cpu before rank10/cpu."""
    return [int(part) if part.isdigit() else part for part in _DIGITS.split(label)]


def kinds() -> Kinds:
    """Every kind's declaration (:func:`gpucheck.detectors.registry.kinds`), loaded on first
    use: the controller imports this module before its workers start, the detectors at the
    run's end."""
    from gpucheck.detectors.registry import kinds as declared

    return declared()


def role(finding: Finding, record: CaseRecord) -> Role:
    """``"diagnosis"`` or ``"symptom"`` for one finding of one case record."""
    return kinds().role(finding, record)


def sanitizer_record(finding: Finding) -> SanitizerFinding | None:
    """The compute-sanitizer record of a ``sanitizer`` finding (None for any other)."""
    return read_back(finding) if finding.kind == SANITIZER.name else None


def subject(finding: Finding, record: SanitizerFinding | None = None) -> str | None:
    """What the finding is about: its op, else its kernel (a sanitizer record, ``record``
    where it is read already: its kernel, else the CUDA API call it names)."""
    if finding.kind == SANITIZER.name:
        parsed = record if record is not None else sanitizer_record(finding)
        if parsed is not None and (parsed.kernel_name or parsed.api_call):
            return str(parsed.kernel_name or parsed.api_call)
        return finding.kernel or finding.op or None
    return finding.op or finding.kernel or None


def signature(text: Any) -> str:
    """``text`` with addresses blanked: two records that differ only there are one."""
    return _HEX.sub("0x…", str(text or ""))


@dataclass
class Occurrence:
    """One finding of one case record, read once: its role, its subject and, for a
    compute-sanitizer record, the record itself (what every format shows of it)."""

    index: int  # the record's index in RunData.cases
    finding: Finding
    record: CaseRecord
    role: Role
    sanitizer: SanitizerFinding | None  # the record of a ``sanitizer`` finding, else None
    subject: str | None

    @classmethod
    def of(cls, index: int, finding: Finding, record: CaseRecord, table: Kinds) -> Occurrence:
        parsed = sanitizer_record(finding)
        return cls(
            index, finding, record, table.role(finding, record), parsed, subject(finding, parsed)
        )

    @property
    def case_key(self) -> tuple[str, str, str]:
        return (self.record.device, self.record.suite, self.record.case)


@dataclass
class Group:
    """Every occurrence of one (kind, subject), and for a diagnosis the symptoms it explains."""

    role: Role
    kind: str
    subject: str | None
    occurrences: list[Occurrence]
    explains: list[Group] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.occurrences)

    @cached_property
    def severity(self) -> str:
        return min(
            (o.finding.severity for o in self.occurrences), key=lambda s: SEVERITY_RANK.get(s, 3)
        )

    @cached_property
    def devices(self) -> list[str]:
        return sorted({o.record.device for o in self.occurrences}, key=natural)

    @cached_property
    def modes(self) -> list[str]:
        return list(dict.fromkeys(o.record.mode for o in self.occurrences))

    @cached_property
    def statuses(self) -> list[str]:
        return sorted({o.record.status for o in self.occurrences})

    @cached_property
    def cases(self) -> list[tuple[str, str]]:
        """(suite, case) of every case it occurred in, in order of first occurrence."""
        return list(dict.fromkeys((o.record.suite, o.record.case) for o in self.occurrences))

    @cached_property
    def messages(self) -> list[tuple[str, int]]:
        """Distinct messages (addresses blanked), most frequent first."""
        counts = Counter(signature(o.finding.message) for o in self.occurrences)
        return counts.most_common()

    @property
    def explained(self) -> int:
        """Symptom findings folded under this diagnosis."""
        return sum(g.count for g in self.explains)

    def title(self) -> str:
        return f"{self.kind} {self.subject}" if self.subject else self.kind

    def line(self, max_message: int = 160) -> str:
        """One line of plain text: kind and subject, where (the case itself when there is one;
        else how many findings in how many cases on which devices), the first message, and
        what it explains."""
        message = self.messages[0][0].splitlines()[0] if self.messages else ""
        if len(message) > max_message:
            message = message[: max_message - 1] + "…"
        if len(self.cases) == 1 and len(self.devices) == 1:
            suite, case = self.cases[0]
            where = f"{self.devices[0]} {suite} {case}"
            if self.count > 1:
                where += f" ({self.count} findings)"
        else:
            where = (
                f"{self.count} finding(s) in {len(self.cases)} case(s) on {', '.join(self.devices)}"
            )
        text = f"{self.title()}: {where}: {message}"
        if len(self.messages) > 1:
            text += f" (+{len(self.messages) - 1} other message(s))"
        if self.explains:
            text += "; explains " + ", ".join(f"{g.count} {g.title()}" for g in self.explains)
        return text

    def to_json(self) -> dict[str, Any]:
        per_case = Counter(o.index for o in self.occurrences)
        return {
            "role": self.role,
            "kind": self.kind,
            "subject": self.subject,
            "severity": self.severity,
            "count": self.count,
            "devices": self.devices,
            "modes": self.modes,
            "statuses": self.statuses,
            "cases": [{"case_index": i, "findings": n} for i, n in per_case.items()],
            "messages": [{"message": m, "count": n} for m, n in self.messages[:20]],
            "more_messages": max(0, len(self.messages) - 20),
            "explains": [g.to_json() for g in self.explains],
        }


@dataclass
class Grouped:
    """The findings of a run: diagnoses (each with what it explains), then the symptoms no
    diagnosis explains; and for each case (device, suite, case) the diagnosis that explains
    its symptoms, the one every format leads with."""

    diagnoses: list[Group]
    symptoms: list[Group]
    leads: dict[tuple[str, str, str], Group] = field(default_factory=dict)
    #: every finding grouped, read once: id(finding) -> its occurrence
    read: dict[int, Occurrence] = field(default_factory=dict)

    def subject(self, finding: Finding) -> str | None:
        """:func:`subject` of a finding, as it was read when it was grouped."""
        o = self.read.get(id(finding))
        return o.subject if o is not None and o.finding is finding else subject(finding)

    def lead(self, record: CaseRecord) -> Group | None:
        """The diagnosis that explains the symptoms of ``record``'s case (its crash, CUDA
        error, failing assert, sanitizer records, in any mode), or None."""
        return self.leads.get((record.device, record.suite, record.case))

    def reading(self, record: CaseRecord) -> list[tuple[str, Finding]]:
        """The findings of ``record`` in the order a diagnosis-first text gives them, each
        with its place: ``"lead"`` (the case's leading diagnosis, its finding on another
        record of the case first where this record has none), ``"diagnosis"``, ``"symptom"``
        (one the lead explains), ``"unexplained"``."""
        lead = self.lead(record)
        out: list[tuple[str, Finding]] = []
        if lead is not None:
            key = (record.device, record.suite, record.case)
            mine = [
                f for f in record.findings if (f.kind, self.subject(f)) == (lead.kind, lead.subject)
            ]
            other = next(o.finding for o in lead.occurrences if o.case_key == key)
            out += [("lead", f) for f in mine or [other]]
        rest = [f for f in in_order(record) if all(f is not g for _, g in out)]
        out += [("diagnosis", f) for f in rest if role(f, record) == DIAGNOSIS]
        where = "symptom" if lead is not None else "unexplained"
        out += [(where, f) for f in rest if role(f, record) == SYMPTOM]
        return out

    def all(self) -> list[Group]:
        """Diagnoses, then unexplained symptoms (the order of the report)."""
        return [*self.diagnoses, *self.symptoms]

    def ranked(self) -> list[tuple[str, list[Group]]]:
        """The findings as the console lists them, titled: the error diagnoses (and the
        warnings that explain a failure), then the errors no diagnosis explains, then every
        other warning and note. A warning never ranks above a case's own failure: a warning a
        suite attached itself is not the diagnosis of its failing assert."""

        table = kinds()

        def leads(g: Group) -> bool:
            return g.severity == "error" or table.of(g.kind).explains_as_warning

        return [
            (title, groups)
            for title, groups in (
                ("diagnoses", [g for g in self.diagnoses if leads(g)]),
                ("symptoms no diagnosis explains", [g for g in self.symptoms if leads(g)]),
                ("warnings and notes", [g for g in self.all() if not leads(g)]),
            )
            if groups
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "diagnoses": [g.to_json() for g in self.diagnoses],
            "symptoms": [g.to_json() for g in self.symptoms],
        }


def _group(occurrences: list[Occurrence], role_: Role, table: Kinds) -> list[Group]:
    by: dict[tuple[str, str | None], list[Occurrence]] = {}
    for o in occurrences:
        by.setdefault((o.finding.kind, o.subject), []).append(o)
    groups = [Group(role_, kind, subj, occ) for (kind, subj), occ in by.items()]
    return sorted(
        groups,
        key=lambda g: (
            SEVERITY_RANK.get(g.severity, 3),
            table.rank(g.kind),
            -g.count,
            g.kind,
            g.subject or "",
        ),
    )


def in_order(record: CaseRecord) -> list[Finding]:
    """The findings of one record in the order every text about it gives them: the diagnoses
    that explain a failure (errors; root causes first, :func:`precedence`), the other
    diagnoses, then the symptoms (a failing assert after the diagnosis that explains it)."""
    table = kinds()

    def key(f: Finding) -> tuple[bool, bool, int, int]:
        diagnosis = table.role(f, record) == DIAGNOSIS
        return (
            not (diagnosis and table.explains(f)),
            not diagnosis,
            SEVERITY_RANK.get(f.severity, 3),
            table.rank(f.kind),
        )

    return sorted(record.findings, key=key)


def precedence(kind: str) -> int:
    """Where a kind stands among the root causes (0 first; the kinds its maker gave no place
    after every one with a place): a missing guard (or a CPU argument) makes the kernel
    fault, which a stream bug or a leak never explains; an output never written, a tensor
    read as if contiguous and a shared-memory race give wrong values (a failing assert) that
    a launch on the legacy stream, always right under CUDA_LAUNCH_BLOCKING, does not. A
    case's symptoms are folded under the first of its diagnoses in this order."""
    return kinds().rank(kind)


def build(cases: list[CaseRecord]) -> Grouped:
    """Group every finding of ``cases`` (the case records of a run, diagnoses attached)."""
    table = kinds()
    every = [Occurrence.of(i, f, r, table) for i, r in enumerate(cases) for f in r.findings]
    diagnosed = [o for o in every if o.role == DIAGNOSIS]
    seen = [o for o in every if o.role == SYMPTOM]
    diagnoses = _group(diagnosed, DIAGNOSIS, table)
    owner: dict[tuple[str, str, str], Group] = {}
    for g in diagnoses:  # worst first, root causes first: a case's symptoms go to its first
        for o in g.occurrences:
            if table.explains(o.finding):
                owner.setdefault(o.case_key, g)
    folded: dict[int, list[Occurrence]] = {}
    rest: list[Occurrence] = []
    for o in seen:
        explained_by = owner.get(o.case_key)
        if explained_by is None:
            rest.append(o)
        else:
            folded.setdefault(id(explained_by), []).append(o)
    for g in diagnoses:
        g.explains = _group(folded.get(id(g), []), SYMPTOM, table)
    read = {id(o.finding): o for o in every}
    return Grouped(diagnoses, _group(rest, SYMPTOM, table), owner, read)
