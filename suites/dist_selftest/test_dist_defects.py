"""Deliberate distributed defects (``gpucheck run --distributed --suite dist_selftest``).

Each case breaks the group on purpose, on the LAST rank (the culprit), the way real training
code does; each must become one finding that names that rank, within the timeout, and the run
must go on with the next case. The culprit is the last rank so that a finding naming rank 0
by default would be wrong.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def _culprit(rank) -> bool:  # type: ignore[no-untyped-def]
    return bool(rank.rank == rank.world_size - 1)


def test_skip_collective(dist_rank) -> None:  # type: ignore[no-untyped-def]
    """A rank-dependent branch skips the second all_reduce on the culprit (story 4)."""
    t = torch.ones(4, device=dist_rank.device)
    dist.all_reduce(t)
    if not _culprit(dist_rank):
        dist.all_reduce(t)


def test_wrong_device(dist_rank) -> None:  # type: ignore[no-untyped-def]
    """The culprit's tensor is on the CPU before the all_reduce (story 5); in a CPU run, where
    every rank is on the CPU, the stand-in for "another device" is the meta device."""
    t = torch.ones(4, device=dist_rank.device)
    if _culprit(dist_rank):
        t = t.cpu() if t.is_cuda else t.to("meta")
    dist.all_reduce(t)


def test_shape_mismatch(dist_rank) -> None:  # type: ignore[no-untyped-def]
    """The culprit all_reduces 5 values, the others 4."""
    dist.all_reduce(torch.ones(5 if _culprit(dist_rank) else 4, device=dist_rank.device))


def test_crash_one_rank(dist_rank) -> None:  # type: ignore[no-untyped-def]
    """The culprit's process dies between two collectives; the others block in the second."""
    t = torch.ones(4, device=dist_rank.device)
    dist.all_reduce(t)
    if _culprit(dist_rank):
        os.abort()
    dist.all_reduce(t)


def test_stuck_rank(dist_rank) -> None:  # type: ignore[no-untyped-def]
    """The culprit is stuck in its own code; only the per-case timeout can tell."""
    t = torch.ones(4, device=dist_rank.device)
    if _culprit(dist_rank):
        time.sleep(3600)
    dist.all_reduce(t)


def test_clean_after_defects(dist_rank) -> None:  # type: ignore[no-untyped-def]
    """A correct case: the fresh group after the defects works (and must stay clean)."""
    t = torch.full((4,), float(dist_rank.rank + 1), device=dist_rank.device)
    dist.all_reduce(t)
    n = dist_rank.world_size
    assert torch.equal(t.cpu(), torch.full((4,), n * (n + 1) / 2))
