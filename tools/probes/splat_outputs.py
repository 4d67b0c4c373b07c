"""Dump the outputs and gradients of gpucheck.ops.rasterize on fixed scenes, or compare two
dumps: how to show that a change to the splat kernels (e.g. the tile binning) changes no
output, by running ``dump`` with the build before and the build after on one GPU.

Scenes (1920x1080, fixed seeds): the benchmark's 1M scene (SH degree 3, depths 2-30,
log-scales -5...-3); 200k Gaussians with opacities u^3 (a sixth below 1/255) and a third of
them needle-thin; 1500 overlapping Gaussians at 64x48 (most pixels stop on the transmittance).
Per scene: image, alpha, depth, radii and the per-Gaussian outputs, the overlap count, and the
gradients of a fixed random loss on image, alpha and depth twice (two backward passes of the
same build: gradients use float atomics, so their spread is the yardstick for a comparison).

Usage: ``python tools/probes/splat_outputs.py dump FILE``;
``python tools/probes/splat_outputs.py compare BEFORE AFTER`` (prints a table; exit 1 when a
forward output differs in any bit or a gradient differs by more than 10x the repeat spread).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "suites" / "splat"))

import splat_scenes  # noqa: E402

from gpucheck.ops import rasterize  # noqa: E402

LEAVES = ("means", "scales", "rotations", "opacities", "sh", "colors", "background")
FORWARD = ("image", "alpha", "depth", "radii", "means2d", "depths", "conics", "colors")


def scenes(device: torch.device) -> dict[str, dict[str, Any]]:
    out = {
        "bench_1m": splat_scenes.scene(
            1_000_000,
            1920,
            1080,
            1234,
            device,
            sh_degree=3,
            depth_range=(2.0, 30.0),
            log_scale=(-5.0, -3.0),
        )
    }
    faint = splat_scenes.scene(
        200_000,
        1920,
        1080,
        77,
        device,
        sh_degree=1,
        depth_range=(1.0, 20.0),
        log_scale=(-5.0, -1.5),
    )
    gen = torch.Generator().manual_seed(77)
    faint["opacities"] = (torch.rand(200_000, generator=gen) ** 3).to(device)
    faint["scales"][::3, 1:] *= 1e-2
    out["faint_thin_200k"] = faint
    out["dense_1500"] = splat_scenes.scene(1500, 64, 48, 5, device, log_scale=(-2.5, -1.0))
    return out


def dump(path: Path) -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    result: dict[str, Any] = {}
    for name, args in scenes(device).items():
        got = rasterize(**args)
        row: dict[str, Any] = {k: getattr(got, k).detach().cpu() for k in FORWARD}
        row["overlaps"] = got.n_intersections
        gen = torch.Generator(device=device).manual_seed(9)
        h, w = args["height"], args["width"]
        weights = [
            torch.randn(s, generator=gen, device=device) for s in ((3, h, w), (h, w), (h, w))
        ]
        for run in (0, 1):
            leaves = {
                k: args[k].clone().requires_grad_() for k in LEAVES if args.get(k) is not None
            }
            res = rasterize(**{**args, **leaves})
            loss = sum(
                ((o * wt).sum() for o, wt in zip(res[:3], weights, strict=True)),
                torch.zeros((), device=device),
            )
            loss.backward()
            grads = {k: v.grad.cpu() for k, v in leaves.items()}
            grads["means2d"] = res.means2d.grad.cpu()
            row[f"grads{run}"] = grads
        result[name] = row
        print(f"{name}: overlaps {row['overlaps']}", flush=True)
    torch.save(result, path)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = float(b.abs().max()) if b.numel() else 0.0
    diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    return diff / scale if scale > 0 else diff


def compare(before: Path, after: Path) -> int:
    a, b = torch.load(before), torch.load(after)
    ok = True
    for name in a:
        x, y = a[name], b[name]
        print(
            f"{name}: overlaps {x['overlaps']} -> {y['overlaps']} "
            f"({100 * (y['overlaps'] / max(x['overlaps'], 1) - 1):+.1f} %)"
        )
        for k in FORWARD:
            same = torch.equal(x[k], y[k])
            ok &= same
            say = "bitwise equal" if same else f"DIFFERS, max rel {_rel(y[k], x[k]):.3g}"
            print(f"  {k:>10}: {say}")
        for k in x["grads0"]:
            spread = max(_rel(x["grads1"][k], x["grads0"][k]), _rel(y["grads1"][k], y["grads0"][k]))
            across = _rel(y["grads0"][k], x["grads0"][k])
            same = torch.equal(y["grads0"][k], x["grads0"][k])
            ok &= across <= max(10 * spread, 1e-6)
            print(
                f"  grad {k:>10}: before vs after max rel {across:.3g} "
                f"({'bitwise' if same else 'not bitwise'}); repeat spread {spread:.3g}"
            )
    print("SAME" if ok else "DIFFERENT")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("file", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.cmd == "dump":
        dump(args.file)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
