"""Which pixels carry a gradient mismatch between gpucheck.ops.rasterize and the float64
reference: the tool that explained a flaky background gradient of the dense scene.

Builds a suite scene from its seeds as the suite does (``splat_scenes.scene`` with the
``EDGE_CASES`` keywords of test_splat_backward.py, the loss weights of
``splat_grads.gradients`` from the loss seed, weight 0 at ``decision_pixels``), and prints
for the pixels that contribute most to the background-gradient difference
``sum_pixels w_image (T_kernel - T_reference)``: the final transmittance of both, the
number of Gaussians each composited and the list position of the last one (the kernel's
``n_contrib``), and whether ``decision_pixels`` leaves the pixel out. Then the relative
errors of every gradient, as ``check_gradients`` computes them.

Usage (on a GPU): ``python tools/probes/splat_grad_pixels.py --case dense --scene 3973149830
--seed 1515521614``; ``--order float64`` composites the reference in float64 depth order
(as before the depth-tie fix) to show the pixels that order put apart.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "suites" / "splat"))

import splat_grads  # noqa: E402
import splat_scenes  # noqa: E402
from test_splat_backward import EDGE_CASES  # noqa: E402

from gpucheck.kernels.splat import reference as splat  # noqa: E402
from gpucheck.kernels.splat.op import ops  # noqa: E402


def _float64_order(depths: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    return visible[torch.argsort(depths.detach()[visible], stable=True)]


def kernel_pixels(args: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """[H, W] final transmittance and list position of the last contribution (the render
    op's own outputs, which its backward starts from)."""
    colors = args.get("colors")
    values = colors if colors is not None else args["sh"]
    degree = args.get("sh_degree")
    if degree is None:
        degree = -1 if colors is not None else math.isqrt(args["sh"].shape[1]) - 1
    means2d, conics, rgb, depths, _, _, ranges, ids, _, _ = ops().project(
        args["means"],
        args["scales"],
        args["rotations"],
        args["opacities"],
        values,
        args["viewmat"],
        args["K"],
        args["background"],
        args["width"],
        args["height"],
        degree,
        None,
    )
    out = ops().render(
        means2d,
        conics,
        args["opacities"],
        rgb,
        depths,
        args["background"],
        ranges,
        ids,
        args["width"],
        args["height"],
    )
    return out[3].double().cpu(), out[4].cpu()


def reference_pixels(args: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """[H, W] final transmittance, number of Gaussians composited and list position (in the
    pixel's tile list) of the last one, float64, in the reference's order."""
    d = {
        k: (v.detach().cpu().double() if isinstance(v, torch.Tensor) else v)
        for k, v in args.items()
    }
    h, w = args["height"], args["width"]
    proj = splat.project(
        d["means"], d["scales"], d["rotations"], d["viewmat"], d["K"], w, h, d["opacities"]
    )
    vis = splat.compositing_order(proj.depths, (proj.radii > 0).nonzero().flatten())
    m, c = proj.means2d[vis].detach(), proj.conics[vis].detach()
    op, tiles = d["opacities"][vis], proj.tiles[vis]
    iy, ix = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    iy, ix = iy.reshape(-1, 1), ix.reshape(-1, 1)
    dx, dy = m[:, 0] - (ix + 0.5), m[:, 1] - (iy + 0.5)
    power = -0.5 * (c[:, 0] * dx * dx + c[:, 2] * dy * dy) - c[:, 1] * dx * dy
    tx, ty = ix // splat.TILE_SIZE, iy // splat.TILE_SIZE
    listed = (tx >= tiles[:, 0]) & (ty >= tiles[:, 1]) & (tx < tiles[:, 2]) & (ty < tiles[:, 3])
    alpha = (op * torch.exp(power)).clamp_max(splat.ALPHA_MAX)
    keep = listed & (power <= 0) & (alpha >= splat.ALPHA_MIN)
    keep &= torch.cumprod(1 - torch.where(keep, alpha, 0.0), dim=1) >= splat.T_MIN
    t_final = torch.prod(1 - torch.where(keep, alpha, 0.0), dim=1)
    position = torch.cumsum(listed.int(), dim=1)  # 1-based in the tile list
    last = torch.where(keep, position, 0).amax(1)
    return (t_final.reshape(h, w), keep.sum(1).reshape(h, w), last.reshape(h, w))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=sorted(EDGE_CASES), default="dense")
    p.add_argument("--scene", type=int, required=True, help="the scene seed (scene=...)")
    p.add_argument("--seed", type=int, required=True, help="the loss seed (seed=...)")
    p.add_argument(
        "--order",
        choices=("float32", "float64"),
        default="float32",
        help="the reference's depth order: float32 keys (now) or float64 (before)",
    )
    p.add_argument("--top", type=int, default=12)
    opt = p.parse_args()
    if opt.order == "float64":
        splat.compositing_order = _float64_order  # rasterize and decision_pixels use it
        splat_grads.compositing_order = _float64_order

    kw = dict(EDGE_CASES[opt.case])
    dev = torch.device("cuda", torch.cuda.current_device())
    args = splat_scenes.scene(kw.pop("n"), kw.pop("width"), kw.pop("height"), opt.scene, dev, **kw)
    h, w = args["height"], args["width"]
    skip = splat_grads.decision_pixels(args)
    gen = torch.Generator().manual_seed(opt.seed)  # gradients()' first draw
    weights = torch.where(skip, 0.0, torch.randn(3, h, w, generator=gen, dtype=torch.float64))

    t_kernel, last_kernel = kernel_pixels(args)
    t_ref, count_ref, last_ref = reference_pixels(args)
    share = weights * (t_kernel - t_ref)  # [3, H, W]
    bg_ref = (weights * t_ref).sum((1, 2))
    print(
        f"{opt.case} scene={opt.scene} seed={opt.seed} order={opt.order}: "
        f"{int(skip.sum())} of {h * w} pixels left out; background gradient "
        f"{[round(v, 6) for v in bg_ref.tolist()]}, kernel - reference "
        f"{[f'{v:.3e}' for v in share.sum((1, 2)).tolist()]}, relative "
        f"{float(share.sum((1, 2)).norm() / bg_ref.norm()):.3e}"
    )
    per = share.abs().sum(0).flatten()
    print("  row  col  skip  T kernel     T reference  rel diff   n ref  last ker/ref  |share|")
    for i in torch.argsort(per, descending=True)[: opt.top].tolist():
        y, x = divmod(i, w)
        tk, tr = float(t_kernel[y, x]), float(t_ref[y, x])
        print(
            f"  {y:3d}  {x:3d}  {int(skip[y, x]):4d}  {tk:.5e}  {tr:.5e}  "
            f"{(tk - tr) / tr:+.2e}  {int(count_ref[y, x]):5d}  "
            f"{int(last_kernel[y, x]):5d}/{int(last_ref[y, x]):<5d}  {float(per[i]):.3e}"
        )
    kernel, oracle = splat_grads.gradients(args, opt.seed, skip=skip)
    for name, e in splat_grads.errors(kernel, oracle).items():
        print(
            f"  grad {name:10s} rel_l2 {e['rel_l2']:.2e}  max_rel {e['max_rel']:.2e}  "
            f"share_over {e['share_over']:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
