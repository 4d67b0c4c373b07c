"""Shards of a run's cases: ``gpucheck run --shard I/N`` runs one of N disjoint parts of the
planned cases, so that a CI matrix or a Slurm array runs one part per job and ``gpucheck
merge`` puts the parts back into one run.

The split is a function of the collected cases alone (and of the durations of an earlier run,
when given): every worker of every job computes it from its own collection and keeps its
part, so no job needs to hear from another. A case is placed by its :func:`case_key`, which
leaves the device out (``test_x[cuda1-fp16]`` and ``test_x[cuda0-fp16]`` are one key): every
device of a shard runs the same cases, whatever GPUs the job's machine has.

Balance: longest first to the lightest shard (LPT), each key weighing its duration in the
earlier run (:func:`weights_of`; a key that run did not hold weighs the mean of those it
held), or 1 without durations (balanced by count). Ties are broken by the key and the shard
number, so the split never depends on the order of collection.

The controller writes the plan of a run (:class:`ShardPlan`) into the run folder once
(``RunFolder.shard``); its workers read it (``--gpucheck-shard FILE``), and so does a resumed
run.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucheck.model.layout import read_regular
from gpucheck.model.results import CaseRecord

#: the device part of a case id's parameters: ``cuda0`` in ``test_x[cuda0-fp16]``
_DEVICE_PARAM = re.compile(r"(?<=[\[-])cuda\d+(?=[\]-])")


class ShardError(ValueError):
    """A shard spec or plan file that is not what gpucheck takes (one sentence)."""


def parse_spec(spec: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``: shard 2 of 4 (counted from 1).

    Raises:
        ShardError: not ``I/N`` with ``1 <= I <= N``.
    """
    index, sep, count = spec.strip().partition("/")
    if not sep or not index.isdigit() or not count.isdigit():
        raise ShardError(f"expected I/N such as 1/4 (shard I of N), got {spec!r}")
    i, n = int(index), int(count)
    if n < 1 or not 1 <= i <= n:
        raise ShardError(
            f"shard {spec!r} does not exist: I/N needs N >= 1 and I from 1 to N (1/{max(n, 1)} "
            f"to {max(n, 1)}/{max(n, 1)})"
        )
    return i, n


def case_key(suite: str, case: str) -> str:
    """The key a case is placed by: its suite and id, the device parameter left out."""
    return f"{suite}::{_DEVICE_PARAM.sub('cuda', case)}"


def weights_of(records: Iterable[CaseRecord]) -> dict[str, float]:
    """Seconds each case key took in an earlier run: per mode the longest of its devices
    (they run side by side), summed over the modes (one after the other). Records the
    controller wrote for a worker (``<worker ...>``) are not cases."""
    longest: dict[tuple[str, str], float] = {}
    for r in records:
        if r.harness_made:
            continue
        k = (case_key(r.suite, r.case), r.mode)
        longest[k] = max(longest.get(k, 0.0), r.duration_s)
    out: dict[str, float] = {}
    for (key, _), seconds in sorted(longest.items()):
        out[key] = out.get(key, 0.0) + seconds
    return out


def assign(keys: Iterable[str], count: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Each key's shard (1..count), longest first to the lightest shard.

    A key without a weight weighs the mean of the known ones (1 where none is known); ties go
    by key, and between shards of one load to the lower number.
    """
    unique = sorted(set(keys))
    known = [w for k in unique if (w := weights.get(k)) is not None and w >= 0]
    default = sum(known) / len(known) if known else 1.0

    def weight(k: str) -> float:
        w = weights.get(k)
        return default if w is None or w < 0 else float(w)

    loads = [(0.0, i) for i in range(1, count + 1)]  # a heap of (load, shard)
    out: dict[str, int] = {}
    for key in sorted(unique, key=lambda k: (-weight(k), k)):
        load, shard = heapq.heappop(loads)
        out[key] = shard
        heapq.heappush(loads, (load + weight(key), shard))
    return out


@dataclass(frozen=True)
class ShardPlan:
    """Which shard a run is, and the weights its split balances (empty: by count)."""

    index: int
    count: int
    weights: dict[str, float] = field(default_factory=dict)
    durations_from: str | None = None

    @property
    def spec(self) -> str:
        return f"{self.index}/{self.count}"

    def keep(self, keys: Iterable[str]) -> set[str]:
        """The keys of ``keys`` in this shard."""
        return {k for k, s in assign(keys, self.count, self.weights).items() if s == self.index}

    def to_json(self) -> dict[str, Any]:
        return {
            "shard": [self.index, self.count],
            "durations_from": self.durations_from,
            "weights": self.weights,
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), sort_keys=True) + "\n")

    @classmethod
    def read(cls, path: Path) -> ShardPlan:
        """The plan in ``path``.

        Raises:
            ShardError: the file is missing or is not a plan gpucheck writes.
        """
        raw = read_regular(path, 256 << 20)
        try:
            value = json.loads(raw) if raw is not None else None
        except json.JSONDecodeError:
            value = None
        shard = value.get("shard") if isinstance(value, dict) else None
        weights = value.get("weights") if isinstance(value, dict) else None
        if (
            not isinstance(shard, list)
            or len(shard) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in shard)
            or not 1 <= shard[0] <= shard[1]
            or not isinstance(weights, dict)
        ):
            raise ShardError(f"{path} is not a shard plan gpucheck writes")
        frm = value.get("durations_from") if isinstance(value, dict) else None
        return cls(
            shard[0],
            shard[1],
            {
                str(k): float(v)
                for k, v in weights.items()
                if isinstance(v, int | float) and not isinstance(v, bool)
            },
            frm if isinstance(frm, str) else None,
        )
