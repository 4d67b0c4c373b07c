"""Deliberate distributed defects (``gpucheck run --distributed --suite dist_selftest``).

Each case breaks the group on purpose, on the LAST rank (the culprit), the way real training
code does; each must become one finding that names that rank, within the timeout, and the run
must go on with the next case. The culprit is the last rank so that a finding naming rank 0
by default would be wrong.
"""

from __future__ import annotations

import os
import time

import pytest
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


@pytest.mark.dist_timeout(10)
def test_stuck_rank(dist_rank) -> None:  # type: ignore[no-untyped-def]
    """The culprit is stuck in its own code; only the case's time limit can tell: alive,
    inside the case and outside any collective, it looks like a slow rank while the others
    wait in the all_reduce. Its limit is 10 s, not --timeout (900 s by default)."""
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


def test_distributed_render_independent_scenes(dist_rank) -> None:  # type: ignore[no-untyped-def]
    """Story 4: every rank trains its own scene on its own views but renders with
    distributed=True; the culprit has one view fewer, so the others wait in the gather of
    their last render call for ever."""
    from dist_checks import render_sharded
    from splat_model import SplatModel, cameras

    with torch.no_grad():
        scene = SplatModel(20, seed=100 + dist_rank.rank).to(dist_rank.device).activated()
    views = cameras(3 - int(_culprit(dist_rank)), 16, seed=dist_rank.rank)
    for view in views:
        render_sharded(scene, [view], 16, distributed=True)


def test_distributed_render_replicated_scene(dist_rank) -> None:  # type: ignore[no-untyped-def]
    """Every rank holds the same whole scene and renders with distributed=True: each Gaussian
    would be rendered once per rank; the renderer must refuse on every rank."""
    from dist_checks import render_sharded
    from splat_model import SplatModel, cameras

    with torch.no_grad():
        scene = SplatModel(20, seed=100).to(dist_rank.device).activated()
    render_sharded(scene, cameras(1, 16, seed=0), 16, distributed=True)


def test_ddp_step_without_sync(dist_rank) -> None:  # type: ignore[no-untyped-def]
    """The DDP step with its backward under ``no_sync()`` (gradient accumulation left on):
    each rank keeps its own gradients; the DDP check must fail on every rank."""
    from dist_checks import ddp_step

    result = ddp_step(dist_rank, n=16, size=16, sync=False)  # small: well within the timeout
    worst = max(result.grad_error.values())
    assert worst <= 1e-4, (
        f"rank {dist_rank.rank}: gradients differ from one process over "
        f"the union of the views by {worst:.3g} (relative)"
    )


def test_skip_async_collective(dist_rank) -> None:  # type: ignore[no-untyped-def]
    """As test_skip_collective, but the collective the culprit skips is asynchronous and
    nobody waits for it: the others' case "passes" (the way an NCCL all_reduce returns once
    queued), and only the count at the case boundary shows the skip."""
    t = torch.ones(4, device=dist_rank.device)
    dist.all_reduce(t)
    if not _culprit(dist_rank):
        dist.all_reduce(t, async_op=True)
