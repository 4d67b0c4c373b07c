"""Time and peak memory of ``gpucheck lint-checkpoint`` on a 3M-Gaussian SH-3 PLY (~700 MB).

The file is written by the package (``gpucheck.checkpoints.write_ply``) with trained-like raw
values, then linted in a fresh process (``python -m gpucheck.cli lint-checkpoint``), cold and
warm page cache as it comes (the file was just written, so it is in the page cache: that is
the warm case; ``--drop-caches`` needs root). Peak memory is the child's max RSS.

    python benchmarks/lint_checkpoint.py [--n 3000000] [--keep PATH] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_scene(path: Path, n: int, activated: bool) -> None:
    import torch

    from gpucheck.checkpoints import GaussianParams, write_ply
    from gpucheck.checkpoints.activations import opacity_activation, scale_activation

    g = torch.Generator().manual_seed(0)
    log_scales = torch.randn(n, 3, generator=g) * 0.8 - 4.5
    logits = torch.randn(n, generator=g) * 2.5
    params = GaussianParams(
        means=torch.randn(n, 3, generator=g) * 4,
        features_dc=torch.randn(n, 1, 3, generator=g),
        features_rest=torch.randn(n, 15, 3, generator=g) * 0.1,
        log_scales=scale_activation(log_scales) if activated else log_scales,
        opacity_logits=opacity_activation(logits) if activated else logits,
        rotations_raw=torch.randn(n, 4, generator=g) + torch.tensor([2.0, 0, 0, 0]),
        sh_degree=3,
    )
    write_ply(params, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="write the PLYs here and keep them")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="gpucheck-lint-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"cpu: {os.cpu_count()} cores; python {sys.version.split()[0]}")
    for activated in (False, True):
        path = folder / f"scene_{args.n}_{'activated' if activated else 'raw'}.ply"
        t0 = time.perf_counter()
        write_scene(path, args.n, activated)
        size = path.stat().st_size
        print(
            f"{path.name}: {size / 1e6:.0f} MB written by gpucheck.checkpoints.write_ply in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        for run in range(args.runs):
            # each run its own process, so max RSS is per run (the first child sets the bar)
            code = (
                "import resource,subprocess,sys,time;t=time.perf_counter();"
                "p=subprocess.run([sys.executable,'-m','gpucheck.cli','lint-checkpoint',"
                "sys.argv[1]],capture_output=True,text=True);w=time.perf_counter()-t;"
                "r=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss*1024;"
                "print(f'{w:.3f} {p.returncode} {r}');print(p.stdout.splitlines()[0])"
            )
            out = subprocess.run(
                [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
            ).stdout.splitlines()
            wall, rc, peak = out[0].split()
            print(
                f"  run {run + 1}: {float(wall):.2f} s wall (process start and imports "
                f"included), exit {rc}, peak RSS {int(peak) / 1e6:.0f} MB "
                f"({int(peak) / size:.2f}x the file) | {out[1]}"
            )
        if args.keep is None:
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
