"""DDP step (``gpucheck run --distributed``): one training step of a small splatting model
(splat forward/backward with an SSIM loss) under DistributedDataParallel, each rank on its own
views. DDP's averaged gradients, and the parameters after the SGD step, must equal one
process's over the union of the views (same device and kernels: gpucheck's CUDA kernels on
GPUs, the pure-PyTorch references on the CPU), also under autocast bf16 and fp16 on GPUs.
"""

from __future__ import annotations

import pytest
import torch
from dist_checks import ddp_step

from gpucheck.testing import assert_close

#: largest gradient error relative to the gradient's largest magnitude, per (device, amp):
#: the two sides differ only in summation order (DDP averages per-rank gradients; one process
#: averages per-view losses) and, on CUDA, float atomics; under autocast the colour head's
#: matmul and the SSIM run in 16 bits on both sides
TOLERANCE = {
    ("cpu", None): 1e-5,
    ("cuda", None): 2e-4,
    ("cuda", "bfloat16"): 3e-2,
    ("cuda", "float16"): 5e-3,
}


@pytest.mark.parametrize("amp", [None, "bfloat16", "float16"])
def test_ddp_step_matches_one_process(dist_rank, amp: str | None) -> None:  # type: ignore[no-untyped-def]
    device = dist_rank.device.type
    if amp is not None and device != "cuda":
        pytest.skip(
            "autocast bf16/fp16 is checked with gpucheck's CUDA kernels; the CPU "
            "reference computes in float64 whatever the autocast dtype"
        )
    result = ddp_step(dist_rank, amp=getattr(torch, amp) if amp else None)
    tol = TOLERANCE[(device, amp)]
    for name, (got, want) in result.grads.items():  # measured errors go to the record
        scale = float(want.abs().max()) or 1.0
        assert_close(
            got,
            want,
            rtol=0,
            atol=tol * scale,
            what=f"rank {dist_rank.rank}: DDP-averaged gradient of {name} vs one "
            f"process over the union of the views ({amp or 'float32'})",
        )
    bad = {k: v for k, v in result.param_error.items() if not v <= tol}
    assert not bad, f"rank {dist_rank.rank}: parameters after the step differ: {bad}"
    if dist_rank.world_size > 1:  # DDP's gradient buckets went through the logged hook
        assert result.collectives >= 1
