"""What is allocated at the peak of one splat training step: the blocks alive at that moment,
by the Python line that allocated them.

Renders a benchmark scene (``splat_scenes.BENCH_SCENES``) with ``gpucheck.ops.rasterize``,
then records the caching allocator's events (``torch.cuda.memory._record_memory_history``)
over one forward + ``image.backward(grad)`` with the parameters' ``.grad`` set to None before
it (as ``benchmarks/splat_vs_gsplat.py`` measures its peak), replays them to find the peak and
prints the blocks alive there beyond what was allocated before the step, grouped by the
innermost frame in this repository. Usage: ``python tools/probes/splat_memory.py [--n 1000000]
[--scene midtrain] [--dtype float32]``.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "suites" / "splat"))

import splat_scenes  # noqa: E402

import gpucheck.kernels.splat.op as splat_ops  # noqa: E402
from gpucheck.ops import rasterize  # noqa: E402

PARAMS = ("means", "scales", "rotations", "opacities", "sh")
MIB = 1 << 20


def _where(frames: list[dict[str, Any]]) -> str:
    """The innermost frame in this repository (else the innermost frame)."""
    for f in frames:
        name = f["filename"]
        if (str(ROOT) in name or "gpucheck" in name) and "splat_memory" not in name:
            short = (
                name.split("gpucheck/", 1)[-1]
                if str(ROOT) not in name
                else str(Path(name).relative_to(ROOT))
            )
            return f"{short}:{f['line']} {f['name']}"
    for f in frames:
        if "splat_memory" in f["filename"]:
            return f"probe:{f['line']} {f['name']}"
    return f"{frames[0]['filename']}:{frames[0]['line']}" if frames else "?"


def peak_blocks(events: list[dict[str, Any]]) -> tuple[int, dict[int, tuple[int, str]], str]:
    """Replay alloc/free events: the largest sum of live blocks, the blocks alive then
    (address: (bytes, where)) and where the allocation that reached the peak came from."""
    live: dict[int, tuple[int, str]] = {}
    total = best = 0
    at_best: dict[int, tuple[int, str]] = {}
    peak_where = ""
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], _where(e.get("frames", [])))
            total += e["size"]
            if total > best:
                best, at_best, peak_where = total, dict(live), live[e["addr"]][1]
        elif e["action"] == "free_requested" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
    return best, at_best, peak_where


PROJECT_OUTPUTS = (
    "means2d",
    "conics",
    "rgb",
    "depths",
    "radii",
    "rects",
    "ranges",
    "ids",
    "opacities32",
    "background32",
)


def watch_project() -> dict[str, tuple[int, int]]:
    """Make ``rasterize`` note where its projection's outputs live (name: (address, bytes))."""
    seen: dict[str, tuple[int, int]] = {}
    found = splat_ops.ops()

    def project(*args: Any) -> Any:
        out = found.project(*args)
        seen.update(
            {name: (t.data_ptr(), t.nbytes) for name, t in zip(PROJECT_OUTPUTS, out, strict=True)}
        )
        return out

    watched = found._replace(project=project)
    splat_ops.ops = lambda: watched  # type: ignore[assignment]
    return seen


def alive(seen: dict[str, tuple[int, int]]) -> list[str]:
    """Which of the noted outputs' blocks are still allocated now (matched by address and
    requested size: a freed block reused by a tensor of another size does not count)."""
    active = {
        (b["address"], b.get("requested_size", b["size"]))
        for seg in torch.cuda.memory._snapshot()["segments"]
        for b in seg["blocks"]
        if b["state"] == "active_allocated"
    }
    return [
        f"{name} ({size / MIB:.1f} MiB)"
        for name, (addr, size) in seen.items()
        if (addr, size) in active
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--scene", default="midtrain", choices=sorted(splat_scenes.BENCH_SCENES))
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    device = torch.device("cuda", 0)
    scene = splat_scenes.to(
        splat_scenes.scene(
            args.n, 1920, 1080, 1234, device, **splat_scenes.BENCH_SCENES[args.scene]
        ),
        device,
        getattr(torch, args.dtype),
    )
    leaves = {k: scene[k].clone().requires_grad_() for k in PARAMS}
    grad = torch.rand(3, 1080, 1920, device=device)
    for _ in range(2):  # warm-up: extension loaded, allocator pools grown
        rasterize(**{**scene, **leaves}).image.backward(grad)
    for v in leaves.values():
        v.grad = None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    seen = watch_project()
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    result = rasterize(**{**scene, **leaves})  # only the image is kept, as the benchmark does
    image, overlaps = result.image, result.n_intersections
    before_project_backward: list[str] = []
    result.means2d.grad_fn.register_prehook(
        lambda grads: before_project_backward.extend(alive(seen)) and None
    )
    del result
    after_forward = alive(seen)
    image.backward(grad)
    torch.cuda.synchronize(device)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    measured = torch.cuda.max_memory_allocated(device) - base
    events = snap["device_traces"][device.index]
    best, blocks, peak_where = peak_blocks(events)
    groups: dict[str, list[int]] = defaultdict(list)
    for size, where in blocks.values():
        groups[where].append(size)
    grads = sum(v.grad.numel() * v.grad.element_size() for v in leaves.values())
    print(
        f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, N={args.n}, "
        f"scene {args.scene}, {args.dtype}, overlaps {overlaps}"
    )
    print(
        f"peak beyond the inputs: {measured / MIB:.1f} MiB (max_memory_allocated), "
        f"{best / MIB:.1f} MiB (replayed, {len(events)} events); parameter gradients "
        f"{grads / MIB:.1f} MiB; the peak reached by: {peak_where}"
    )
    print(f"projection outputs allocated after the forward: {', '.join(after_forward)}")
    print(
        "... and when the projection's backward starts: "
        f"{', '.join(before_project_backward) or 'none'}"
    )
    print(f"{'MiB':>8} {'blocks':>6}  allocated at")
    for where, sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(sizes) / MIB:8.1f} {len(sizes):6d}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
