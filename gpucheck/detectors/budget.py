"""Which calls the checks that make a call again make again, per worker process: the
unwritten-output probe (:mod:`gpucheck.detectors.unwritten`) and the memory-layout re-run
(:mod:`gpucheck.detectors.memory_layout`).

A suite calls an op with many shapes (a parametrized test, an image per size), and a re-run
costs calls of the op. What such a check finds depends on the op and its arguments' dtypes,
ranks and layouts (a *family*, which each check defines), and on a shape only where the shape
leaves a tail: a kernel launched over 16×16 tiles or blocks of 256 threads that skips or
overruns the last partial one. So per family a process makes again the calls of at most
:data:`SHAPES` shapes, each of a *tail pattern* not made again before (:func:`tails`: which
dimensions are not a multiple of :data:`TILE`, and whether the element count is not one of
:data:`BLOCK`): the first shape of a family, then the first with a tail where the first had
none (or the other way round). A family in which a check found a bug is made again on every
shape (its evidence on later calls: the finding of each case, what numerics needs).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

#: shapes of one family made again per process (each of another tail pattern)
SHAPES = 3
#: the tile edge a dimension's tail is measured against (the rasterizers' 16×16 tiles)
TILE = 16
#: the block an element count's tail is measured against (a 1-D launch of 256 threads)
BLOCK = 256


def tails(tensors: list[Any]) -> tuple[Any, ...]:
    """The tail pattern of a call's tensors: per tensor, which dimensions are not a multiple
    of :data:`TILE` and whether its element count is not one of :data:`BLOCK`."""
    return tuple(
        (tuple(int(n) % TILE != 0 for n in t.shape), t.numel() % BLOCK != 0) for t in tensors
    )


class Families:
    """The tail patterns a check made again, by family (one per process and check)."""

    def __init__(self, shapes: int = SHAPES) -> None:
        self.shapes = shapes
        self.lock = threading.Lock()
        self.made: dict[Hashable, set[Hashable]] = {}
        self.buggy: set[Hashable] = set()

    def take(self, family: Hashable, pattern: Hashable) -> bool:
        """Whether a call of ``family`` with tail ``pattern`` is made again (and, if so, the
        pattern is counted as made)."""
        with self.lock:
            if family in self.buggy:
                return True
            made = self.made.setdefault(family, set())
            if pattern in made or len(made) >= self.shapes:
                return False
            made.add(pattern)
            return True

    def bug(self, family: Hashable) -> None:
        """The check found a bug in a call of ``family``: every later call is made again."""
        with self.lock:
            self.buggy.add(family)

    def clear(self) -> None:
        with self.lock:
            self.made.clear()
            self.buggy.clear()
