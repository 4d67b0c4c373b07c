"""The compile-only check (``nox -s compile`` / ``python -m gpucheck._csrc``): every source of
the extension, the self-test's and the example's, and every defect variant, compiled (not
linked) for sm_90 against torch's headers; works without a GPU."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpucheck._csrc import toolchain, zoo
from gpucheck._csrc.defects import DEFECTS, defect_flags, defect_units, example_defect_units
from gpucheck._csrc.pybind import PYBIND_DEFECTS, pybind_defect_units
from gpucheck._csrc.sources import csrc_dir, example_csrc_dir, sources
from gpucheck._csrc.toolchain import CHECK_ARCH, CXX_FLAGS, NVCC_FLAGS


def check_only_sources() -> list[Path]:
    """CUDA sources built elsewhere (JIT, by the harness's self-test; the example extension of
    examples/custom_rnn_extension/, its own build) but compile-checked too."""
    from gpucheck import _resources

    found: list[Path] = []
    selftest = _resources.suites() / "selftest"
    for folder in (selftest, selftest / "zoo", example_csrc_dir()):
        if folder.is_dir():
            found += sorted(folder.glob("*.cpp")) + sorted(folder.glob("*.cu"))
    return found


def _torch_compile_env(cuda_home: Path, scratch: Path) -> tuple[list[str], list[str]]:
    """Include flags and the nvcc flags torch itself adds for extensions (a header torch's CPU
    wheel lacks is written under ``scratch``, a folder the caller removes)."""
    import sysconfig

    import torch
    from torch.utils import cpp_extension

    # include_paths("cpu"): a CPU build of torch knows no toolkit, so add its include dir here.
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    includes += [
        f"-I{cuda_home / 'include'}",
        f"-I{csrc_dir()}",
        f"-I{sysconfig.get_paths()['include']}",
    ]
    torch_include = Path(cpp_extension.include_paths()[0])
    if not (torch_include / "c10/cuda/impl/cuda_cmake_macros.h").exists():
        # CPU wheels ship c10/cuda headers but not this one generated file; recreate it with
        # the content a CUDA build generates, in a private include dir.
        shim = scratch / "shim"
        (shim / "c10/cuda/impl").mkdir(parents=True)
        (shim / "c10/cuda/impl/cuda_cmake_macros.h").write_text(
            "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"
        )
        includes.append(f"-I{shim}")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    common = [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_EXTENSION_NAME=_C", "-std=c++20"]
    return includes + common, list(cpp_extension.COMMON_NVCC_FLAGS)


def check_units(defects: str = "with") -> tuple[list[tuple[Path, list[str], str]], list[str]]:
    """What the compile check compiles: (source, extra flags, label) of every source
    (``defects="skip"``: those only), then of every source a defect's macro changes, compiled
    again under that defect's flags (``"only"``: those only); and the defects whose macro no
    source of their kernel names (their build would be the clean one)."""
    units: list[tuple[Path, list[str], str]] = []
    if defects != "only":
        units += [(f, [], "") for f in sources() + check_only_sources()]
    missing = []
    if defects != "skip":
        for name, build in DEFECTS.items():
            touched = defect_units(name)
            if not touched:
                missing.append(
                    f"{name}: no source of csrc/{build.kernel}/ (or a header it "
                    f"includes) names {build.macro}"
                )
            units += [(f, defect_flags(name), f" [{name}]") for f in touched]
        units += example_defect_units() + pybind_defect_units() + zoo.defect_units()
        missing += [
            f"pybind {name}: no source of the self-test's pybind extension names {macro}"
            for name, macro in PYBIND_DEFECTS.items()
            if not any(label == f" [pybind {name}]" for *_, label in units)
        ]
        missing += zoo.missing()
    return units, missing


def _command(
    nvcc: str, src: Path, obj: Path, flags: list[str], includes: list[str], torch_nvcc: list[str]
) -> list[str]:
    """The command that compiles (not links) ``src`` into ``obj`` for sm_90 with ``flags``: a
    .cu file as CUDA, with the flags torch adds for extensions, anything else as C++."""
    if src.suffix == ".cu":
        head = ["-c", str(src), "-o", str(obj), *CHECK_ARCH, *NVCC_FLAGS, *torch_nvcc]
    else:
        head = ["-x", "c++", "-c", str(src), "-o", str(obj), *CXX_FLAGS]
    return [nvcc, *head, *includes, *flags, "-Xcompiler", "-fPIC"]


def compile_check(jobs: int = 2, defects: str = "with") -> int:
    """Compile (not link) every source for sm_90 against torch's headers, and again every
    source a defect macro changes under that macro (see :func:`check_units`). Returns an exit
    code.

    Works on machines without a GPU: the CPU wheel of torch ships the CUDA headers, and nvcc
    compiles .cu files without a device.
    """
    cuda_home = toolchain.cuda_home()
    if cuda_home is None:
        print("compile check: nvcc not found (set CUDA_HOME or put nvcc on PATH)", file=sys.stderr)
        return 2
    nvcc = str(cuda_home / "bin" / "nvcc")
    units, missing = check_units(defects)
    root = csrc_dir().parent  # sources are printed relative to it (csrc/..., suites/...)
    for m in missing:
        print(f"MISSING  defect {m}")
    if not units:
        print("compile check: csrc/ has no sources yet; nothing to compile")
        return 1 if missing else 0
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        includes, torch_nvcc = _torch_compile_env(cuda_home, Path(tmp))
        procs: list[tuple[Path, str, list[str], subprocess.Popen[bytes], float]] = []
        pending = list(enumerate(units))
        while pending or procs:
            while pending and len(procs) < jobs:
                i, (src, flags, label) = pending.pop(0)
                obj = Path(tmp) / f"{i}_{src.stem}{src.suffix.replace('.', '_')}.o"
                cmd = _command(nvcc, src, obj, flags, includes, torch_nvcc)
                procs.append(
                    (
                        src,
                        label,
                        cmd,
                        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
                        time.monotonic(),
                    )
                )
            src, label, cmd, proc, start = procs.pop(0)
            out, _ = proc.communicate()
            rel = src.relative_to(root) if root in src.parents else src
            took = time.monotonic() - start
            if proc.returncode == 0:
                print(f"compiled {rel}{label} ({took:.1f} s)")
                if out.strip():
                    print(out.decode(errors="replace"))
            else:
                failures += 1
                print(f"FAILED   {rel}{label}\n  {' '.join(cmd)}\n{out.decode(errors='replace')}")
    variants = sum(bool(label) for _, _, label in units)
    print(
        f"compile check: {len(units) - failures} of {len(units)} sources compiled for sm_90 "
        f"({variants} of them defect variants)"
        + (f"; {len(missing)} defect(s) missing from the sources" if missing else "")
    )
    return 1 if failures or missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compile-only check of gpucheck's CUDA sources")
    parser.add_argument("--jobs", type=int, default=max(1, os.cpu_count() or 1))
    parser.add_argument(
        "--defects",
        choices=("with", "skip", "only"),
        default="with",
        help="the defect variants (csrc/README.md): compile them too (default), "
        "skip them, or compile only them",
    )
    args = parser.parse_args(argv)
    return compile_check(args.jobs, args.defects)
