"""``gpucheck selftest``: the harness over deliberately broken extensions, and a matrix of
defect × detector that says whether each defect was found by the detector meant for it
(right kind, severity, device and op) and whether any clean case drew a finding.

The defects live in ``suites/selftest/``: a small pybind extension (no device guard, an
out-of-bounds write, an abort, a raw ``cudaMalloc`` never freed, a quadratic scratch
buffer), a pybind extension called from an ``autograd.Function`` built once per
``GPUCHECK_PYBIND_DEFECT_*`` macro (``gpucheck._csrc.pybind.PYBIND_DEFECTS``: stream 0 in forward,
cub on stream 0 in backward, output on the current device, a bare ``cudaSetDevice``; and
its clean build called through ``ctypes`` on stream 0 and given a CPU tensor), a checkpoint
writer that stores activated values, and gpucheck's own SSIM and KNN built with a
``GPUCHECK_DEFECT_*`` macro each (``gpucheck._csrc.defects.DEFECTS``). Rows that need
more GPUs or a pass that was not run (``sanitizer:<tool>``) are reported as not run, never as found.

The zoo (``suites/selftest/zoo/``, :data:`ZOO`) is judged apart: pybind11 extensions in the
shape of the field's code (a 3DGS rasterizer, a fused SSIM loss, simple-knn's distCUDA2, an
RWKV-style RNN), each called from a ``torch.autograd.Function`` and built clean and with up to
two defects at once (``gpucheck._csrc.zoo.ZOO_BUILDS``). Each row states every finding its cases
must draw; any other finding is unexpected (:func:`zoo_matrix`: recall and unexpected findings
per row).

The matrix and its rows are :mod:`gpucheck.selftest.matrix`, the zoo's
:mod:`gpucheck.selftest.zoo`; this module builds the defect builds, reads the run and gives the
verdict.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpucheck.model.layout import RunFolder
from gpucheck.model.results import CaseRecord
from gpucheck.model.runlog import RunLog
from gpucheck.selftest.matrix import (
    CLEAN,
    DEFECTS,
    SANITIZER,
    Defect,
    Row,
    matrix,
    pass_of,
)
from gpucheck.selftest.zoo import ZOO, Expect, ZooResult, ZooRow, zoo_matrix

__all__ = [
    "CLEAN",
    "DEFECTS",
    "SANITIZER_MODES",
    "ZOO",
    "Defect",
    "Expect",
    "Row",
    "ZooResult",
    "ZooRow",
    "matrix",
    "pass_of",
    "prebuild",
    "read_run",
    "verdict",
    "zoo_matrix",
]

#: the sanitizer passes of ``gpucheck selftest --sanitizer``: every tool a row needs (a
#: defect's or a zoo expectation's)
SANITIZER_MODES = tuple(
    dict.fromkeys(
        m
        for m in [*(d.mode for d in DEFECTS), *(e.mode for row in ZOO for e in row.expected)]
        if m.startswith(SANITIZER)
    )
)
#: the name of the real kernels among :func:`prebuild`'s builds (their clean twins use them)
KERNELS = "kernels"


def prebuild(
    logs: Path,
    names: Iterable[str] | None = None,
    pybind: Iterable[str] | None = None,
    zoo: Iterable[str] | None = None,
) -> list[str] | None:
    """JIT-build the defect builds (``gpucheck._csrc.defects.DEFECTS``), the builds of the pybind
    extension (``pybind``: ``clean`` and names of ``gpucheck._csrc.pybind.PYBIND_DEFECTS``, default
    all; logged as ``pybind_<build>``), the zoo's builds (``zoo``: names of
    ``gpucheck._csrc.zoo.ZOO_BUILDS``, default all; logged as ``zoo_<build>``) and, where they
    were not built at install, gpucheck's
    kernels (the clean twins' ops), all at once, one process each, from the package's
    sources into gpucheck's build cache
    (``gpucheck._csrc.toolchain.build_dir``): the selftest's workers then load them instead of
    building them one after another inside their cases (a cached build only loads). Each build's
    output goes to ``logs/<name>.log`` (the kernels': ``logs/kernels.log``). Returns the names
    whose build failed (their cases error with the compiler's message), or None when this
    machine cannot build them (no CUDA build of torch, or no nvcc): the cases then skip or
    fail on their own.
    """
    import importlib.util
    import os
    import subprocess
    import sys

    from gpucheck._csrc import toolchain
    from gpucheck._csrc.defects import DEFECTS
    from gpucheck._csrc.pybind import PYBIND_CLEAN, PYBIND_DEFECTS
    from gpucheck._csrc.zoo import ZOO_BUILDS

    names = list(DEFECTS if names is None else names)
    if not names or importlib.util.find_spec("torch") is None or toolchain.cuda_home() is None:
        return None
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.version.cuda)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode != 0 or probe.stdout.strip() in ("", "None"):
        return None
    logs.mkdir(parents=True, exist_ok=True)
    builds = {
        name: [
            "from gpucheck._csrc.defects import build_defect; "
            "build_defect(sys.argv[1], verbose=True)",
            name,
        ]
        for name in names
    }
    builds[KERNELS] = ["from gpucheck._csrc import extension; sys.exit(extension.child_main())"]
    every = (PYBIND_CLEAN, *PYBIND_DEFECTS)
    for build in every if pybind is None else pybind:
        builds[f"pybind_{build}"] = [
            "from gpucheck._csrc.pybind import build_pybind; "
            "build_pybind(sys.argv[1], verbose=True)",
            build,
        ]
    for build in ZOO_BUILDS if zoo is None else zoo:
        builds[f"zoo_{build}"] = [
            "from gpucheck._csrc.zoo import build_zoo; build_zoo(sys.argv[1], verbose=True)",
            build,
        ]
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", str(max(1, (os.cpu_count() or 1) // len(builds))))
    procs = {}
    for name, (code, *args) in builds.items():
        with open(logs / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, "-c", f"import sys; {code}", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
    return [name for name, proc in procs.items() if proc.wait() != 0]


def read_run(run_dir: Path) -> tuple[list[CaseRecord], int]:
    """Every case record of the run in ``run_dir`` (its diagnoses attached) and how many
    GPUs it targeted."""
    log = RunLog.read(RunFolder(run_dir).results)
    devices = log.header.devices if log.header is not None else []
    return log.diagnosed_cases(), sum(d.device.startswith("cuda") for d in devices)


def verdict(
    rows: list[Row], false: list[dict[str, Any]], zoo: list[ZooResult] | None = None
) -> int:
    """0 every defect found and no false positive; 1 a defect missed or a false positive, or
    in the zoo (``zoo``) an expected finding missed or an unexpected one; 2 complete
    otherwise but some rows, zoo rows or zoo expectations could not run here (e.g. one
    GPU)."""
    zoo = zoo or []
    if (
        false
        or any(r.status == "missed" for r in rows)
        or any(z.missed or z.unexpected for z in zoo)
    ):
        return 1
    return (
        2
        if any(r.status == "not run" for r in rows) or any(z.not_run or not z.ran for z in zoo)
        else 0
    )
