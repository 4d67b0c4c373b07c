"""The distributed checks of the ``dist`` suite, as functions every rank calls.

* :func:`ddp_step`: one training step of :class:`splat_model.SplatModel`
  under ``DistributedDataParallel``, each rank on its own views; the averaged gradients (and
  the parameters after the SGD step) must equal one process's over the union of the views.
* :func:`render_sharded`: Gaussians sharded across the ranks, gathered (sizes first, padded,
  differentiable) and rendered jointly on each rank, the way gsplat's ``distributed=True``
  shares Gaussians between ranks; with ``distributed=False`` every rank renders its own
  Gaussians and no collective is issued (the collective log proves it).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from splat_model import SplatModel, cameras, render, ssim_loss, targets

from gpucheck.distributed import collectives

FIELDS = ("means", "scales", "rotations", "opacities", "colors")


class DistributedModeError(RuntimeError):
    """``distributed=True`` rendering used where it cannot be right."""


@dataclass
class StepResult:
    """Largest error of each parameter's gradient / updated value, relative to its scale."""

    grad_error: dict[str, float] = field(default_factory=dict)
    param_error: dict[str, float] = field(default_factory=dict)
    collectives: int = 0  # gradient all-reduces DDP issued (its comm hook logged them)
    #: parameter name -> (DDP's averaged gradient, one process's), detached
    grads: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = float(want.detach().abs().max()) or 1.0
    return float((got.detach().double() - want.detach().double()).abs().max()) / scale


def ddp_step(
    rank: Any,
    *,
    n: int = 48,
    size: int = 24,
    views_per_rank: int = 1,
    amp: torch.dtype | None = None,
    lr: float = 0.05,
    sync: bool = True,
) -> StepResult:
    """One DDP step on this rank's views vs one process on all views (same device, dtype).

    Args:
        rank: this process's :class:`gpucheck.distributed.rank.Rank`.
        n: Gaussians of the model.
        size: image side in pixels.
        views_per_rank: cameras each rank trains on (rank r takes the r-th block).
        amp: autocast dtype (torch.bfloat16 / torch.float16, CUDA) or None for float32.
        lr: SGD learning rate of the step.
        sync: False runs the backward under ``ddp.no_sync()`` (gradient accumulation left
            on by mistake): each rank keeps its own gradients, which the check must catch.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = rank.device
    world = rank.world_size
    views = cameras(views_per_rank * world, size, seed=7)
    wanted = [t.to(device) for t in targets(views, size)]
    mine = range(rank.rank * views_per_rank, (rank.rank + 1) * views_per_rank)
    base = SplatModel(n, seed=3).to(device)
    single = copy.deepcopy(base)
    ddp = DDP(
        base, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
    )
    ddp.register_comm_hook(None, collectives.ddp_comm_hook())
    log = collectives.current()
    before = log.seq if log is not None else 0

    def loss_over(model: Any, which: Any) -> torch.Tensor:
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            losses = [
                ssim_loss(model(views[i][0], views[i][1], size), wanted[i], amp) for i in which
            ]
        return torch.stack([x.float() for x in losses]).mean()

    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    opt.zero_grad()
    with contextlib.nullcontext() if sync else ddp.no_sync():
        loss_over(ddp, mine).backward()
    opt_single = torch.optim.SGD(single.parameters(), lr=lr)
    opt_single.zero_grad()
    loss_over(single, range(len(views))).backward()
    result = StepResult()
    for (name, p), q in zip(base.named_parameters(), single.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        result.grad_error[name] = _rel(p.grad, q.grad)
        result.grads[name] = (p.grad.detach().clone(), q.grad.detach().clone())
    opt.step()
    opt_single.step()
    for (name, p), q in zip(base.named_parameters(), single.parameters(), strict=True):
        result.param_error[name] = _rel(p, q)
    result.collectives = (log.seq - before) if log is not None else 0
    return result


class _GatherShards(torch.autograd.Function):
    """all_gather of variable-sized [N_r, ...] shards into [sum N_r, ...]; backward: the
    gradient of the whole, summed over the ranks (each rank's loss uses every Gaussian),
    sliced to this rank's shard."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, sizes: list[int], me: int) -> torch.Tensor:
        ctx.sizes, ctx.me = sizes, me
        biggest = max(sizes)
        padded = shard.new_zeros((biggest, *shard.shape[1:]))
        padded[: shard.shape[0]] = shard
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous())
        return torch.cat([p[:k] for p, k in zip(parts, sizes, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        start = sum(ctx.sizes[: ctx.me])
        return grad[start : start + ctx.sizes[ctx.me]], None, None


def _fingerprint(g: dict[str, torch.Tensor]) -> int:
    data = g["means"].detach().float().cpu().contiguous().numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=7).digest(), "little")


_CALLS = [0]


def render_sharded(
    g: dict[str, torch.Tensor],
    views: list[tuple[torch.Tensor, torch.Tensor]],
    size: int,
    *,
    distributed: bool,
) -> list[torch.Tensor]:
    """Render ``views`` from this rank's activated Gaussians ``g`` (dict of FIELDS).

    ``distributed=True``: ``g`` is this rank's shard of ONE scene; the shards of all ranks
    are gathered (every rank must call this the same number of times) and each view is
    rendered with all of them. ``distributed=False``: ``g`` is this rank's own scene; no
    collective at all.

    Raises:
        DistributedModeError: ``distributed=True`` while every rank holds the same Gaussians
            (a replicated scene, not shards: each Gaussian would be rendered world-size times).
    """
    if not distributed:
        return [render(g, v, k, size) for v, k in views]
    _CALLS[0] += 1
    log = collectives.current()
    if log is not None:
        log.tag = f"gpucheck.distributed.render_sharded(distributed=True) call {_CALLS[0]}"
    try:
        dev = g["means"].device
        head = torch.tensor([g["means"].shape[0], _fingerprint(g)], dtype=torch.int64, device=dev)
        heads = [torch.empty_like(head) for _ in range(dist.get_world_size())]
        dist.all_gather(heads, head)
        sizes = [int(h[0]) for h in heads]
        prints = {int(h[1]) for h in heads}
        if len(heads) > 1 and len(prints) == 1 and sizes[0] > 0:
            raise DistributedModeError(
                f"distributed=True, but all {len(heads)} ranks hold the same {sizes[0]} "
                "Gaussians: that is a replicated (or per-rank) scene, not shards of one scene; "
                "the gathered scene would hold every Gaussian once per rank. Render each "
                "rank's own scene with distributed=False (no collective at all)"
            )
        me = dist.get_rank()
        full = {k: _GatherShards.apply(g[k].contiguous(), sizes, me) for k in FIELDS}
    finally:
        if log is not None:
            log.tag = None
    return [render(full, v, k, size) for v, k in views]


def shard(g: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s part of ``g``: uneven contiguous blocks (sizes differ by design)."""
    n = g["means"].shape[0]
    cuts = [round(n * (i * i + i) / (world * world + world)) for i in range(world + 1)]
    return {k: v[cuts[rank] : cuts[rank + 1]] for k, v in g.items()}
