"""Which cases each rank of a distributed group runs in a generation (a fresh group: the
first, or the one after a finding), and which of them it records.

A case of a group is done when every rank recorded it, or when the group's record of a fault
in it (written once, on the culprit rank) stands for all of them. A rank that recorded a case
its peers did not (ranks run at their own pace between collectives: a run stopped mid-way
leaves one rank ahead of another) runs it again with them, unrecorded, so that the group
meets in every case it runs: each rank's records then hold each case once. This is what
``--resume`` runs, under gpucheck's own ranks, torchrun's and a Ray cluster's alike.

Where several gpucheck processes own the group's ranks (torchrun's, a Ray run's nodes), each
knows the records of its own ranks only: before a generation starts, each publishes what its
ranks recorded through the group's :class:`~gpucheck.controller.dist_group.Meeting` and
reads the others', so that every owner starts the same cases.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpucheck.model import clock
from gpucheck.model.fleet import rank_of
from gpucheck.model.layout import RunFolder
from gpucheck.model.runlog import RunLog


class Meeting(Protocol):
    """Where the owners of a group's ranks show each other files
    (:class:`gpucheck.controller.dist_group.Meeting`)."""

    def push(self, paths: Iterable[Path]) -> None: ...

    def pull(self, paths: Iterable[Path]) -> None: ...


#: seconds an owner waits for the others' records before a generation (a node that does not
#: answer by then is gone: the run ends with that sentence)
EXCHANGE_WAIT_S = 120.0


@dataclass
class Recorded:
    """What the records of a group say, as one owner knows them."""

    #: rank -> the cases it recorded
    by_rank: dict[int, set[str]] = field(default_factory=dict)
    #: cases with the group's record of a fault (done for every rank)
    group: set[str] = field(default_factory=set)

    def to_json(self, rank: int) -> bytes:
        return json.dumps(
            {"cases": sorted(self.by_rank.get(rank, set())), "group": sorted(self.group)}
        ).encode()

    def take(self, rank: int, data: str) -> None:
        """Another owner's publication of rank ``rank`` (:meth:`to_json`)."""
        value = json.loads(data)
        self.by_rank[rank] = {c for c in value.get("cases", []) if isinstance(c, str)}
        self.group |= {c for c in value.get("group", []) if isinstance(c, str)}


def recorded(
    log: RunLog, run_id: str, mode: str, ranks: list[int], before: float | None = None
) -> Recorded:
    """The cases each of ``ranks`` recorded in the run, and the group's fault records. With
    ``before``, only cases started before then: a rank whose peers were killed fails the cases
    after a finding in no time, and those records must not keep it from running them again."""
    log.refresh()
    out = Recorded({r: set() for r in ranks})
    for r in log.cases:
        if r.run_id != run_id or r.mode != mode or r.harness_made:
            continue
        if r.distributed is not None:
            out.group.add(r.case)
        elif (rank := rank_of(r.device)) in out.by_rank and (
            before is None or (clock.parse(r.started_at) or 0.0) < before
        ):
            out.by_rank[rank].add(r.case)
    return out


def left(done: Recorded, world: int, also: set[str]) -> tuple[list[str], dict[int, list[str]]]:
    """What the next generation runs: the cases every rank skips (each recorded them, or the
    group did, or they are in ``also``: the cases of this run's findings so far), and per rank
    those it runs again without recording them (it recorded them, a peer did not)."""
    sets = [done.by_rank.get(r, set()) for r in range(world)]
    everyone = set.intersection(*sets) if sets else set()
    skip = everyone | done.group | also
    return sorted(skip), {r: sorted(cases - skip) for r, cases in done.by_rank.items()}


def exchange(
    mine: Recorded,
    world: int,
    path_of: Callable[[int], Path],
    meeting: Meeting,
    check_stopped: Callable[[], None],
) -> Recorded:
    """Every rank's records, where other owners own some: ours published at ``path_of(rank)``
    (one file per rank and generation), theirs read as they publish them.

    Raises:
        RuntimeError: an owner did not publish within :data:`EXCHANGE_WAIT_S`.
    """
    ours = list(mine.by_rank)
    for rank in ours:
        path = path_of(rank)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(mine.to_json(rank))
        tmp.replace(path)
    meeting.push(path_of(r) for r in ours)
    missing = [r for r in range(world) if r not in mine.by_rank]
    deadline = time.monotonic() + EXCHANGE_WAIT_S
    while missing:
        meeting.pull(path_of(r) for r in missing)
        check_stopped()
        for rank in list(missing):
            with contextlib.suppress(OSError, ValueError):
                mine.take(rank, path_of(rank).read_text())
                missing.remove(rank)
        if missing and time.monotonic() > deadline:
            raise RuntimeError(
                f"the owners of rank(s) {', '.join(map(str, missing))} did not say what their "
                f"ranks recorded within {EXCHANGE_WAIT_S:g} s"
            )
        if missing:
            time.sleep(0.2)
    return mine


def first_generation(out_dir: Path, mode: str, world: int) -> int:
    """The first generation of a group that starts in ``out_dir``: 0 in a new run, after
    every generation an earlier invocation of the run left files of (``--resume``), so that
    none of theirs (a rank's exit code, a claimed finding, a rendezvous) is taken for one of
    this group's."""
    folder = RunFolder(out_dir)
    gens = [folder.next_generation(f"rank{r}", mode) for r in range(world)]
    prefix = f"group.{mode}."
    for path in folder.workers.glob(prefix + "*"):
        number = path.name[len(prefix) :].split(".")[0]
        if number.isdigit():
            gens.append(int(number) + 1)
    return max(gens, default=0)
