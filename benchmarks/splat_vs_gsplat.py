"""Side by side on one GPU: gpucheck.ops.rasterize and gsplat.rasterization (gsplat 1.5.3).

The same scenes and camera as ``benchmarks/splat.py`` (100k / 1M / 3M random Gaussians, SH
degree 3, depths 2-30, log-scales -5...-3, so a median screen radius of ~10 px; 1920x1080),
rendered in one process by both. gsplat gets the same tensors: ``quats`` = our wxyz
``rotations``, ``colors`` = our SH ``[N, 16, 3]`` with ``sh_degree=3``, ``viewmats`` /
``Ks`` = our ``viewmat`` / ``K`` with a camera axis, ``backgrounds`` = our background, and our
near plane (0.2; its default is 0.01, which culls nothing more here); its other defaults are
our conventions too (``eps2d=0.3`` low-pass, ``rasterize_mode="classic"``, tile size 16, no
``radius_clip``, the same Jacobian clamp and pixel centres). Both render RGB with alpha; ours
also renders the expected depth.

What differs by design (so the images agree closely, not bitwise):

* gsplat clamps alpha at 0.999, we at 0.99 (3DGS): ``psnr`` is over the scene as it is,
  ``psnr_clamped`` over the same scene with opacities <= 0.99, where both clamps are inactive.
* gsplat bins each Gaussian into the tiles of an opacity-aware, axis-aligned box
  (``sqrt(2 ln(255 opacity))`` sigmas per axis, at most 3.33); we use the same kind of box
  (with float32 margins) intersected with the 3-sigma square of the larger eigenvalue (3DGS's
  radius), so we sort and visit slightly fewer (Gaussian, tile) pairs (``overlaps``). Pairs
  that only one side visits have alpha < 1/255 everywhere in the tile, so they do not change
  the image.
* gsplat projects in float32 and is compiled with ``-use_fast_math``; we project in float64.

Timing as in benchmarks/splat.py: medians of CUDA-event-timed forward calls (no grad), backward
calls (``image.backward(grad)`` with means, scales, rotations, opacities and SH requiring grad),
and training steps (forward + backward); peak: the most device memory allocated during one
step beyond the resident inputs. gsplat runs both its modes (``packed=True`` is its default).

gsplat is optional and imported only here. It JIT-compiles its CUDA sources on first use
(minutes; TORCH_CUDA_ARCH_LIST, MAX_JOBS). ``--gsplat-so PATH`` loads an extension built that
way before (``$TORCH_EXTENSIONS_DIR/gsplat_cuda/gsplat_cuda.so``) instead of compiling again.
Usage: ``python benchmarks/splat_vs_gsplat.py [--n 100000 1000000] [--repeats 30] [--json F]
[--profile N]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "suites" / "splat"))

import splat_scenes  # noqa: E402
from splat import time_training  # noqa: E402

from gpucheck.ops import rasterize  # noqa: E402

PARAMS = ("means", "scales", "rotations", "opacities", "sh")
Render = Callable[[dict[str, torch.Tensor]], torch.Tensor]


def load_gsplat(prebuilt: Path | None) -> tuple[ModuleType, float]:
    """gsplat with its CUDA extension loaded; the seconds that took (the JIT build, if any)."""
    if prebuilt is not None:  # what `from gsplat import csrc` (gsplat's first try) then finds
        spec = importlib.util.spec_from_file_location("gsplat_cuda", prebuilt)
        assert spec is not None and spec.loader is not None, prebuilt
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["gsplat.csrc"] = module
    start = time.perf_counter()
    import gsplat
    from gsplat.cuda._backend import _C

    if _C is None:
        raise RuntimeError("gsplat: no CUDA extension (no CUDA toolkit found?)")
    return gsplat, time.perf_counter() - start


def scene(
    n: int, device: torch.device, width: int = 1920, height: int = 1080, kind: str = "bench"
) -> dict[str, Any]:
    return splat_scenes.scene(n, width, height, 1234, device, **splat_scenes.BENCH_SCENES[kind])


def ours(args: dict[str, Any]) -> tuple[Render, Callable[[], int]]:
    """Our renderer over ``args`` (image [3, H, W]) and the overlap count of the last call."""
    last: dict[str, int] = {}

    def render(p: dict[str, torch.Tensor]) -> torch.Tensor:
        out = rasterize(**{**args, **p})
        last["overlaps"] = out.n_intersections
        return out.image

    return render, lambda: last["overlaps"]


def theirs(
    gsplat: ModuleType, args: dict[str, Any], packed: bool
) -> tuple[Render, Callable[[], int]]:
    """gsplat's renderer over the same scene (image [H, W, 3], its layout)."""
    viewmats, Ks = args["viewmat"][None], args["K"][None]
    # [C, 3]; but gsplat 1.5.3's packed path checks the background against the leading dims
    # of the packed [nnz, 2] means (none), so there it takes our one camera's [3] (same memory)
    backgrounds = args["background"] if packed else args["background"][None]
    last: dict[str, Any] = {}

    def render(p: dict[str, torch.Tensor]) -> torch.Tensor:
        colors, _, meta = gsplat.rasterization(
            p["means"],
            p["rotations"],
            p["scales"],
            p["opacities"],
            p["sh"],
            viewmats,
            Ks,
            args["width"],
            args["height"],
            near_plane=0.2,
            eps2d=0.3,
            sh_degree=3,
            packed=packed,
            tile_size=16,
            backgrounds=backgrounds,
            render_mode="RGB",
            rasterize_mode="classic",
            radius_clip=0.0,
        )
        last["meta"] = meta
        return colors[0]

    return render, lambda: int(last["meta"]["isect_ids"].numel())


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR (peak 1) between two [3, H, W] images."""
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def agreement(gsplat: ModuleType, args: dict[str, Any], grad: torch.Tensor) -> dict[str, Any]:
    """Image PSNR between ours and gsplat's (as is, and with opacities <= 0.99), the largest
    pixel difference, and the relative L2 difference of each gradient (opacities <= 0.99)."""
    params = {k: args[k] for k in PARAMS}
    render, _ = ours(args)
    gs, _ = theirs(gsplat, args, packed=True)
    with torch.no_grad():
        mine, other = render(params), gs(params).permute(2, 0, 1)
        out: dict[str, Any] = {
            "psnr": psnr(mine, other),
            "max_abs": float((mine - other).abs().max()),
        }
    clamped = {**params, "opacities": params["opacities"].clamp(max=0.99)}
    grads, images = [], []
    for fn, g in ((render, grad), (gs, grad.permute(1, 2, 0).contiguous())):
        leaves = {k: v.clone().requires_grad_() for k, v in clamped.items()}
        image = fn(leaves)
        image.backward(g)
        grads.append({k: v.grad for k, v in leaves.items()})
        images.append(image.detach())
    out["psnr_clamped"] = psnr(images[0], images[1].permute(2, 0, 1))
    out["grad_rel_diff"] = {
        k: float((grads[0][k] - grads[1][k]).norm() / grads[1][k].norm()) for k in PARAMS
    }
    return out


def compare(
    gsplat: ModuleType,
    n: int,
    repeats: int,
    device: torch.device,
    kind: str = "bench",
    packed: bool = True,
) -> dict[str, Any]:
    args = scene(n, device, kind=kind)
    params = {k: args[k] for k in PARAMS}
    grad = torch.rand(3, args["height"], args["width"], device=device)
    grad_hwc = grad.permute(1, 2, 0).contiguous()
    row: dict[str, Any] = {"n": n, "scene": kind}
    render, overlaps = ours(args)
    row["ours"] = {**time_training(render, params, grad, repeats, device), "overlaps": overlaps()}
    for mode in (False, True) if packed else (False,):
        render, overlaps = theirs(gsplat, args, mode)
        row[f"gsplat_{'packed' if mode else 'unpacked'}"] = {
            **time_training(render, params, grad_hwc, repeats, device),
            "overlaps": overlaps(),
        }
    row["agreement"] = agreement(gsplat, args, grad)
    del args, params
    torch.cuda.empty_cache()
    return row


def profile(
    gsplat: ModuleType, n: int, device: torch.device, steps: int = 10, kind: str = "bench"
) -> str:
    """Per-kernel device time of ``steps`` training steps of each (torch.profiler)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    args = scene(n, device, kind=kind)
    grad = torch.rand(3, args["height"], args["width"], device=device)
    tables = []
    for name, (render, _), g in (
        ("ours", ours(args), grad),
        ("gsplat unpacked", theirs(gsplat, args, False), grad.permute(1, 2, 0).contiguous()),
    ):
        leaves = {k: args[k].clone().requires_grad_() for k in PARAMS}
        for _ in range(3):
            render(leaves).backward(g)
        torch.cuda.synchronize(device)
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                render(leaves).backward(g)
            torch.cuda.synchronize(device)
        table = prof.key_averages().table(
            sort_by="cuda_time_total", row_limit=16, max_name_column_width=60
        )
        tables.append(f"== {name}, scene {kind}, N={n}, {steps} training steps\n{table}")
    return "\n".join(tables)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000, 3_000_000])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--gsplat-so", type=Path, help="a gsplat_cuda.so built before")
    parser.add_argument(
        "--profile",
        type=int,
        metavar="N",
        help="also print per-kernel profiles of both at N Gaussians",
    )
    parser.add_argument(
        "--scene",
        nargs="+",
        default=["bench"],
        choices=sorted(splat_scenes.BENCH_SCENES),
        help="the scenes (splat_scenes.BENCH_SCENES)",
    )
    parser.add_argument(
        "--no-packed", action="store_true", help="gsplat unpacked only (its faster mode here)"
    )
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    gsplat, load_s = load_gsplat(args.gsplat_so)
    print(f"gsplat {gsplat.__version__} loaded in {load_s:.1f} s", flush=True)
    rows = [
        compare(gsplat, n, args.repeats, device, kind, not args.no_packed)
        for kind in args.scene
        for n in args.n
    ]
    result = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gsplat": gsplat.__version__,
        "rows": rows,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.profile:
        for kind in args.scene:
            print(profile(gsplat, args.profile, device, kind=kind))
    print(
        f"{'scene':>8} {'N':>8} {'who':>16} {'fwd ms':>7} {'bwd ms':>7} {'f+b ms':>7} "
        f"{'peak MiB':>9} {'fwd pk':>7} {'bwd pk':>7} {'overlaps':>9}"
    )
    for row in rows:
        for who in ("ours", "gsplat_unpacked", "gsplat_packed"):
            if who not in row:
                continue
            t = row[who]
            print(
                f"{row['scene']:>8} {row['n']:>8} {who:>16} {t['forward_ms']:7.3f} "
                f"{t['backward_ms']:7.3f} {t['fwd_bwd_ms']:7.3f} {t['peak_train_mib']:9.1f} "
                f"{t['peak_forward_mib']:7.1f} {t['peak_backward_mib']:7.1f} "
                f"{t['overlaps']:>9}"
            )
        ours, base = row["ours"], row["gsplat_unpacked"]
        speedup = base["forward_ms"] / ours["forward_ms"]
        print(
            f"{'':>8} ours vs gsplat unpacked: forward {speedup:.2f}x, "
            f"step {base['fwd_bwd_ms'] / ours['fwd_bwd_ms']:.2f}x, peak "
            f"{ours['peak_train_mib'] / base['peak_train_mib']:.2f} of gsplat's "
            f"(gradients {ours['grads_mib']:.0f} MiB, image {ours['image_mib']:.0f} MiB of both)"
        )
        a = row["agreement"]
        print(
            f"{'':>8} PSNR ours vs gsplat {a['psnr']:.1f} dB (opacities <= 0.99: "
            f"{a['psnr_clamped']:.1f} dB), max |diff| {a['max_abs']:.2e}, gradient rel diff "
            + ", ".join(f"{k} {v:.1e}" for k, v in a["grad_rel_diff"].items())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
