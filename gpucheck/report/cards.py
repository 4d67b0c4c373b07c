"""The finding cards of report.html: one card per (kind, subject) group, diagnoses first.

A card says what the group is (kind, op or kernel, severity), its distinct messages with
counts, what to do, every case it occurred on (device, mode, status, how many findings), and
the evidence of a few occurrences whose evidence differs (the same sanitizer record on two
devices and four modes is shown once). A diagnosis card folds the symptoms it explains into
a ``<details>``: each symptom group with its counts and one sample of its evidence. The full
text of every finding stays in results.jsonl and results.json.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpucheck.report import evidence
from gpucheck.report.groups import Group, Grouped, Occurrence, signature
from gpucheck.report.rundata import RunData

#: occurrences of a group shown with their evidence (only ones whose evidence differs)
MAX_SAMPLES = 3
#: ... of a symptom group folded under a diagnosis
MAX_FOLDED_SAMPLES = 1
#: distinct messages listed on a card (the next ones are folded, up to MAX_FOLDED_MESSAGES)
MAX_MESSAGES = 6
MAX_FOLDED_MESSAGES = 200
#: case rows listed on a card
MAX_ROWS = 40
#: evidence text kept per block (the full text stays in results.jsonl / results.json)
MAX_TEXT = 12_000
ROLES = {
    "diagnosis": (
        "Diagnoses",
        "what went wrong and where, each with the symptoms it explains "
        "(crashes, CUDA errors, sanitizer records and test failures of the same "
        "cases)",
    ),
    "symptom": (
        "Symptoms no diagnosis explains",
        "how failures looked from outside; no detector named their cause, so read the evidence",
    ),
    "warning": (
        "Warnings and notes",
        "findings below error that explain no failure (a warning "
        "never ranks above a case's own failure)",
    ),
}
#: the role of each of :meth:`Grouped.ranked`'s sections, and its cards' id prefix
_SECTION_ROLES = {
    "diagnoses": ("diagnosis", "d"),
    "symptoms no diagnosis explains": ("symptom", "s"),
    "warnings and notes": ("warning", "w"),
}


def cut(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` with its middle cut out when it is longer than ``limit``."""
    if len(text) <= limit:
        return text
    return (
        text[: limit // 3]
        + "\n[... cut: the full text is in results.jsonl ...]\n"
        + text[-2 * limit // 3 :]
    )


def _blocks(o: Occurrence, labels: dict[str, str], tails: set[int]) -> list[dict[str, Any]]:
    """Evidence blocks of one occurrence; a worker's stderr tail is shown once per card."""
    out = []
    for b in evidence.blocks(o, labels):
        if b["type"] == "pre":
            if b["title"] == "worker stderr (tail)":
                key = hash(signature(b["text"]))
                if key in tails:
                    continue
                tails.add(key)
            b = {**b, "text": cut(b["text"])}
        out.append(b)
    return out


def _samples(g: Group, labels: dict[str, str], limit: int) -> tuple[list[dict[str, Any]], int]:
    """Up to ``limit`` occurrences with distinct evidence, and how many were not shown."""
    seen: set[str] = set()
    tails: set[int] = set()
    shown: list[dict[str, Any]] = []
    for o in g.occurrences:
        key = signature(o.finding.evidence or o.finding.message)
        if key in seen:
            continue
        seen.add(key)
        if len(shown) < limit:
            shown.append(
                {
                    "device": o.record.device,
                    "mode": o.record.mode,
                    "status": o.record.status,
                    "case": o.record.case,
                    "message": o.finding.message,
                    "blocks": _blocks(o, labels, tails),
                }
            )
    return shown, len(seen) - len(shown)


def _rows(g: Group, data: RunData, cell_of: dict[int, str]) -> list[dict[str, Any]]:
    per = Counter(o.index for o in g.occurrences)
    rows = []
    for i, n in per.items():
        r = data.cases[i]
        rows.append(
            {
                "case": r.case,
                "suite": r.suite,
                "device": r.device,
                "mode": r.mode,
                "status": r.status,
                "n": n,
                "href": cell_of.get(i),
            }
        )
    return rows


def _card(
    g: Group,
    card_id: str,
    data: RunData,
    labels: dict[str, str],
    cell_of: dict[int, str],
    samples: int,
) -> dict[str, Any]:
    first = g.occurrences[0].finding
    shown, hidden = _samples(g, labels, samples)
    rows = _rows(g, data, cell_of)
    return {
        "id": card_id,
        "role": g.role,
        "kind": g.kind,
        "title": evidence.kind_title(g.kind),
        "subject": g.subject,
        "severity": g.severity,
        "count": g.count,
        "cases": len(g.cases),
        "devices": g.devices,
        "modes": g.modes,
        "statuses": g.statuses,
        "hint": evidence.hint_for(first),
        "messages": g.messages[:MAX_MESSAGES],
        "folded_messages": g.messages[MAX_MESSAGES:MAX_FOLDED_MESSAGES],
        "more_messages": max(0, len(g.messages) - MAX_FOLDED_MESSAGES),
        "rows": rows[:MAX_ROWS],
        "more_rows": max(0, len(rows) - MAX_ROWS),
        "samples": shown,
        "more_samples": hidden,
        "open_first": samples > MAX_FOLDED_SAMPLES,
        "explains": [
            _card(e, f"{card_id}-{n}", data, labels, cell_of, MAX_FOLDED_SAMPLES)
            for n, e in enumerate(g.explains)
        ],
        "explained": g.explained,
        "explains_text": ", ".join(f"{e.count} {e.title()}" for e in g.explains),
        "all_devices": sorted(
            {o.record.device for o in g.occurrences}
            | {o.record.device for e in g.explains for o in e.occurrences}
        ),
        "all_statuses": sorted(
            {o.record.status for o in g.occurrences}
            | {o.record.status for e in g.explains for o in e.occurrences}
        ),
    }


def sections(
    data: RunData, grouped: Grouped, cell_of: dict[int, str]
) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The sections of the findings (error diagnoses, unexplained error symptoms, warnings
    and notes: :meth:`Grouped.ranked`), each a list of kinds with their cards; and the card
    of every case record that has a finding."""
    labels = data.uuid_labels()
    card_of_case: dict[int, str] = {}
    used_ids: set[str] = set()
    out = []
    for section, groups in grouped.ranked():
        role, prefix = _SECTION_ROLES[section]
        kinds: dict[str, list[dict[str, Any]]] = {}
        counts: Counter[str] = Counter()
        for n, g in enumerate(groups):
            card = _card(g, f"{prefix}-{n}", data, labels, cell_of, MAX_SAMPLES)
            kinds.setdefault(g.kind, []).append(card)
            counts[g.kind] += g.count
            # a case's link goes to the card it appears on (folded symptoms: their diagnosis)
            for o in [*g.occurrences, *(o for e in g.explains for o in e.occurrences)]:
                card_of_case.setdefault(o.index, card["id"])
        blocks: list[dict[str, Any]] = []
        for kind, cards in kinds.items():
            anchor = f"kind-{kind}" if f"kind-{kind}" not in used_ids else f"kind-{kind}-{role}"
            used_ids.add(anchor)
            blocks.append(
                {
                    "kind": kind,
                    "anchor": anchor,
                    "title": evidence.kind_title(kind),
                    "about": evidence.kind_about(kind),
                    "cards": cards,
                    "count": counts[kind],
                }
            )
        title, about = ROLES[role]
        out.append(
            {
                "role": role,
                "title": title,
                "about": about,
                "kinds": blocks,
                "count": sum(counts.values()),
                "cards": len(groups),
                "explained": sum(g.explained for g in groups),
            }
        )
    return out, card_of_case
