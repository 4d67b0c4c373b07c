"""What a run over a Ray cluster (``gpucheck run --ray``) writes besides case records: in
results.jsonl, a ``lost`` record for each node that was lost mid-run, naming the node and the
cases its loss left without a record (of its devices; of every rank, for a distributed group,
whose ranks on the other nodes stop with it): exactly what ``--resume`` runs.

A device of such a run is named with its node: ``node-a/cuda:1`` (:func:`device_name`); a rank
of a distributed run is named with its global rank as well: ``rank1/cpu``, and over a Ray
cluster ``node-a/rank1/cuda:1`` (:func:`rank_of`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpucheck.model.results import SCHEMA_ID, text


def device_name(node: str, label: str) -> str:
    """The name of device ``label`` (``cuda:1``, ``cpu``) of node ``node`` in a fleet run."""
    return f"{node}/{label}"


_RANK = re.compile(r"rank(\d+)")


def node_of(device: str) -> str | None:
    """The node of a fleet run's device name (None for a device of a one-machine run, a rank
    of a one-machine distributed run too: ``rank1/cpu``)."""
    parts = device.split("/")
    if len(parts) >= 2 and _RANK.fullmatch(parts[-2]):
        del parts[-2]
    return "/".join(parts[:-1]) or None


def rank_of(device: str) -> int | None:
    """The global rank of a distributed run's device name (``rank1/cpu``,
    ``node-a/rank1/cuda:1``), None for any other device."""
    parts = device.split("/")
    found = _RANK.fullmatch(parts[-2]) if len(parts) >= 2 else None
    return int(found.group(1)) if found else None


@dataclass
class NodeLost:
    """A ``lost`` record: node ``node`` was lost (killed, unreachable) and these cases,
    planned, have no record; ``--resume`` runs them."""

    run_id: str
    node: str
    reason: str
    #: (device, mode, case) of each case planned and not recorded
    cases: list[tuple[str, str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_ID,
            "record": "lost",
            "run_id": self.run_id,
            "node": self.node,
            "reason": self.reason,
            "cases": [{"device": d, "mode": m, "case": c} for d, m, c in self.cases],
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> NodeLost | None:
        """A ``lost`` record as read back (tolerant; None when it names no node)."""
        node, cases = value.get("node"), value.get("cases")
        if not isinstance(node, str):
            return None
        kept = [
            (text(c["device"], 200), text(c["mode"], 200), text(c["case"], 2000))
            for c in (cases if isinstance(cases, list) else [])
            if isinstance(c, dict)
            and all(isinstance(c.get(k), str) for k in ("device", "mode", "case"))
        ]
        return cls(
            text(value.get("run_id") or "", 200),
            text(node, 200),
            text(value.get("reason") or "", 2000),
            kept,
        )

    @classmethod
    def of(cls, extras: dict[str, list[dict[str, Any]]], run_id: str) -> list[NodeLost]:
        """The ``lost`` records of run ``run_id`` among a results file's other records
        (``RunLog.extras``)."""
        found = [cls.from_json(v) for v in extras.get("lost", [])]
        return [r for r in found if r is not None and r.run_id == run_id]
