"""Distributed rendering (``gpucheck run --distributed``): Gaussians sharded across the ranks
(uneven shards), gathered and rendered jointly, must give the image one process renders from
all of them, and the same gradients; the per-GPU-independent mode must issue no collective."""

from __future__ import annotations

import torch
from dist_checks import FIELDS, render_sharded, shard
from splat_model import SplatModel, cameras, render, ssim_loss, targets

from gpucheck.distributed import collectives
from gpucheck.testing import assert_close

SIZE = 24
#: gradient tolerance (relative to the gradient's largest magnitude): float atomics on CUDA
GRAD_TOL = {"cpu": 1e-6, "cuda": 1e-4}


def _scene(device: torch.device) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        g = SplatModel(60, seed=11).to(device).activated()
    return {k: v.detach().clone().requires_grad_(True) for k, v in g.items()}


def test_sharded_render_equals_single_render(dist_rank) -> None:  # type: ignore[no-untyped-def]
    rank, world, device = dist_rank.rank, dist_rank.world_size, dist_rank.device
    views = cameras(world, SIZE, seed=5)
    wanted = [t.to(device) for t in targets(views, SIZE)]
    full = _scene(device)
    mine = {k: v.detach().clone().requires_grad_(True) for k, v in shard(full, rank, world).items()}
    (image,) = render_sharded(mine, [views[rank]], SIZE, distributed=True)
    # one process: every view from all Gaussians, the loss summed over the ranks' views
    images = [render(full, v, k, SIZE) for v, k in views]
    assert torch.equal(image, images[rank].detach()), (
        "the jointly rendered image differs from the single render of all Gaussians"
    )
    ssim_loss(image, wanted[rank]).backward()
    torch.stack([ssim_loss(im, t) for im, t in zip(images, wanted, strict=True)]).sum().backward()
    part = shard({k: v.grad for k, v in full.items()}, rank, world)
    tol = GRAD_TOL[device.type]
    for name in FIELDS:
        want = part[name]
        assert mine[name].grad is not None, name
        scale = float(want.abs().max()) or 1.0
        assert_close(
            mine[name].grad,
            want,
            rtol=0,
            atol=tol * scale,
            what=f"rank {rank} gradient of its shard's {name}",
        )


def test_independent_mode_issues_no_collective(dist_rank) -> None:  # type: ignore[no-untyped-def]
    rank, device = dist_rank.rank, dist_rank.device
    log = collectives.current()
    assert log is not None, "the collective log is not installed"
    views = cameras(2, SIZE, seed=6 + rank)
    scene = _scene(device)
    before, mark = log.seq, log.path.stat().st_size
    images = render_sharded(scene, views, SIZE, distributed=False)
    sum(im.mean() for im in images).backward()  # type: ignore[union-attr]
    entered = [e for e in collectives.read(log.path) if e.ev == "enter"]
    new = log.path.read_text()[mark:]
    assert log.seq == before and '"ev":"enter"' not in new, (
        f"distributed=False issued collectives: {[e.op for e in entered][-5:]}"
    )
    for (v, k), im in zip(views, images, strict=True):
        assert torch.equal(im.detach(), render(scene, v, k, SIZE).detach())
