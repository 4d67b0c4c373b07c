"""A distributed group's records: each rank's collective log, and a group fault's record.

**The collective log.** One JSON object per line, appended by each rank
(:class:`gpucheck.distributed.collectives.CollectiveLog`) and read by the watchdog in the
parent (:mod:`gpucheck.distributed.analysis`) while the ranks run, so a line may be torn and
the file may come from a rank killed mid-write::

    {"ev": "case", "case": "test_ddp.py::test_step", "seq": 0, "t": 1732412345.0}
    {"ev": "enter", "seq": 3, "op": "all_reduce", "rank": 1, "shapes": [[4]],
     "dtypes": ["float32"], "devices": ["cuda:1"], "case": "test_ddp.py::test_step",
     "where": "test_ddp.py:41", "async": false, "t": 1732412345.1}
    {"ev": "done", "seq": 3, "op": "all_reduce", "t": 1732412345.2}

``error`` lines name the exception (``kind: "device"`` when the wrapper refused a tensor on
another device), ``case-end`` lines the case's ``outcome``, a ``group-lost`` line the
boundary (``phase``) where the rank found the others gone. :class:`CollectiveEntry` writes a
line and reads it back; :func:`read_log` reads a rank's file, leaving out every line that is
not an entry as the writer writes it.

**A group fault's record** (:class:`GroupRecord`): a case record's ``distributed`` object,
what the watchdog found (its kind, the ranks at fault and those left waiting, the collective).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard, get_args

#: what a line of the collective log says: a case began, a collective was entered, returned
#: or raised, a case ended, the other ranks were gone at a case's boundary (the rank stops)
Event = Literal["case", "enter", "done", "error", "case-end", "group-lost"]
EVENTS: tuple[Event, ...] = get_args(Event)
#: the fields of an entry that are texts when present (``None`` allowed)
_TEXTS = ("op", "case", "where", "tag", "error", "kind", "outcome", "phase")


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


@dataclass
class CollectiveEntry:
    """One line of a rank's collective log."""

    ev: Event
    #: the rank's collectives so far (an ``enter`` line's is the collective's number: the
    #: same on every rank for one collective)
    seq: int = 0
    op: str | None = None
    rank: int | None = None
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    case: str | None = None
    where: str | None = None  # file:line of the call
    tag: str | None = None  # who issued it (a renderer, ``ddp``)
    is_async: bool = False  # ``async_op=True`` (written as ``async``)
    error: str | None = None
    kind: str | None = None  # an error's: ``device`` (the wrapper refused a tensor)
    outcome: str | None = None  # a case-end's
    phase: str | None = None  # a group-lost's: the boundary (``start`` or ``end`` of the case)
    timeout: float | None = None  # a case's own limit (``dist_timeout``)
    t: float | None = None  # epoch seconds

    def to_json(self) -> dict[str, Any]:
        """The line's object: the event, then every field that says something."""
        out: dict[str, Any] = {"ev": self.ev, "seq": self.seq}
        for name in ("op", "rank", "shapes", "dtypes", "devices", *_TEXTS[1:]):
            value = getattr(self, name)
            if value is not None and value != []:
                out[name] = value
        if self.is_async:
            out["async"] = True
        for name in ("timeout", "t"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, value: Any) -> CollectiveEntry | None:
        """The entry of one line, or None when it is not one as the writer writes it (a
        field of another type, an event it does not write, a collective line without its
        number): the watchdog judges only what a rank wrote."""
        if not isinstance(value, dict) or value.get("ev") not in EVENTS:
            return None
        seq, rank, timeout, t = (value.get(k) for k in ("seq", "rank", "timeout", "t"))
        shapes = value.get("shapes", [])
        if (
            (seq is not None and not _int(seq))
            or any(value.get(k) is not None and not isinstance(value.get(k), str) for k in _TEXTS)
            or not all(_strings(value.get(k, [])) for k in ("dtypes", "devices"))
            or not (
                isinstance(shapes, list)
                and all(isinstance(s, list) and all(_int(n) for n in s) for s in shapes)
            )
            or (timeout is not None and not _number(timeout))
            or (value["ev"] in ("enter", "done", "error") and seq is None)
        ):
            return None
        return cls(
            ev=value["ev"],
            seq=0 if seq is None else seq,
            rank=rank if _int(rank) else None,
            shapes=shapes,
            dtypes=value.get("dtypes", []),
            devices=value.get("devices", []),
            is_async=value.get("async") is True,
            timeout=float(timeout) if _number(timeout) else None,
            t=float(t) if _number(t) else None,
            **{k: value.get(k) for k in _TEXTS},
        )

    def line(self) -> bytes:
        """The entry as one line of the log."""
        return (json.dumps(self.to_json(), separators=(",", ":"), default=str) + "\n").encode()


def read_log(path: Path) -> list[CollectiveEntry]:
    """The entries of one rank's log. A torn last line (a rank killed in the middle of a
    write), or any line that is not an entry (:meth:`CollectiveEntry.from_json`), is left
    out; a file that cannot be read has none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for raw in text.splitlines():
        try:
            entry = CollectiveEntry.from_json(json.loads(raw))
        except (json.JSONDecodeError, RecursionError):
            continue
        if entry is not None:
            out.append(entry)
    return out


def _ranks(value: Any) -> list[int]:
    return [r for r in value if _int(r)] if isinstance(value, list) else []


@dataclass
class GroupRecord:
    """A case record's ``distributed``: what the watchdog found wrong with the group."""

    kind: str  # hang | collective-mismatch | collective-device | rank-crash | rank-failure
    cause_ranks: list[int] = field(default_factory=list)  # the ranks at fault
    waiting_ranks: list[int] = field(default_factory=list)  # those left waiting
    seq: int | None = None  # the collective's number
    op: str | None = None
    time_to_finding_s: float = 0.0  # how long after the case began the watchdog knew
    world_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "cause_ranks": self.cause_ranks,
            "waiting_ranks": self.waiting_ranks,
            "seq": self.seq,
            "op": self.op,
            "time_to_finding_s": self.time_to_finding_s,
            "world_size": self.world_size,
        }

    @classmethod
    def from_json(cls, value: Any) -> GroupRecord | None:
        """``distributed`` as read back, or None when it is not an object. Tolerant: a kind
        that is not text reads as ``unknown``, ranks that are not integers are left out."""
        if not isinstance(value, dict):
            return None
        kind, seq, op = value.get("kind"), value.get("seq"), value.get("op")
        took, size = value.get("time_to_finding_s"), value.get("world_size")
        return cls(
            kind=kind[:200] if isinstance(kind, str) and kind else "unknown",
            cause_ranks=_ranks(value.get("cause_ranks")),
            waiting_ranks=_ranks(value.get("waiting_ranks")),
            seq=seq if _int(seq) else None,
            op=op[:200] if isinstance(op, str) else None,
            time_to_finding_s=max(0.0, float(took)) if _number(took) else 0.0,
            world_size=size if _int(size) else None,
        )
