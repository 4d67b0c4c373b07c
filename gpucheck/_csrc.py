"""Where the CUDA sources are and how they are compiled: the one place setup.py and the
compile-only check (``nox -s compile`` / ``python -m gpucheck._csrc``) both read.

This module must not import torch at import time (setup.py loads it by path).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CSRC = Path(__file__).resolve().parent.parent / "csrc"
EXTENSION_NAME = "gpucheck._C"
#: Environment variable selecting a subset of kernels (comma separated folder names of csrc/).
KERNELS_ENV = "GPUCHECK_KERNELS"

CXX_FLAGS = ["-O3"]
NVCC_FLAGS = ["-O3", "-lineinfo", "--expt-relaxed-constexpr", "-Xptxas=-warn-spills"]
#: Architecture for the compile-only check (setup.py uses TORCH_CUDA_ARCH_LIST instead).
CHECK_ARCH = ["-gencode=arch=compute_90,code=sm_90"]


def kernels() -> list[str]:
    """Names of the kernel folders in csrc/ that hold sources, honouring GPUCHECK_KERNELS."""
    found = sorted(
        p.name
        for p in CSRC.iterdir()
        if p.is_dir() and (any(p.glob("*.cu")) or any(p.glob("*.cpp")))
    ) if CSRC.is_dir() else []
    wanted = [k.strip() for k in os.environ.get(KERNELS_ENV, "").split(",") if k.strip()]
    if wanted:
        unknown = sorted(set(wanted) - set(found))
        if unknown:
            raise SystemExit(f"{KERNELS_ENV} names unknown kernels {unknown}; csrc/ has {found}")
        return [k for k in found if k in wanted]
    return found


def sources() -> list[Path]:
    """All translation units of the extension: csrc/*.cpp plus csrc/<kernel>/*.{cpp,cu}."""
    if not CSRC.is_dir():
        return []
    files = sorted(CSRC.glob("*.cpp"))
    for k in kernels():
        files += sorted((CSRC / k).glob("*.cpp")) + sorted((CSRC / k).glob("*.cu"))
    return files


#: Deliberate defects compiled from the same sources (csrc/README.md): macro -> kernel folder.
DEFECTS = {"GPUCHECK_DEFECT_LEGACY_STREAM": "ssim"}


def defect_library(macro: str) -> str:
    """The op namespace of a defect build (``torch.ops.<it>.*``): the real extension keeps
    ``gpucheck``, so both load in one process."""
    return "gpucheck_" + macro.removeprefix("GPUCHECK_").lower()


def defect_flags(macro: str) -> list[str]:
    """Compiler flags of the defect build of ``macro`` (C++ and nvcc alike)."""
    return [f"-D{macro}", f"-DGPUCHECK_LIBRARY={defect_library(macro)}"]


def build_defect(macro: str, verbose: bool = False) -> str:
    """JIT-build (``torch.utils.cpp_extension.load``) and load the defect build of ``macro``:
    registration.cpp and its kernel folder, compiled with :func:`defect_flags`. Returns the
    op namespace (``torch.ops.<namespace>.<op>``). Needs a CUDA toolkit and a CUDA torch.
    """
    from torch.utils import cpp_extension

    kernel = DEFECTS[macro]
    files = sorted(CSRC.glob("*.cpp")) + sorted((CSRC / kernel).glob("*.cpp")) + sorted(
        (CSRC / kernel).glob("*.cu"))
    os.environ.update(host_compiler_env())  # the same compiler rule as setup.py
    name = defect_library(macro)
    # is_python_module=False: a plain library whose static initializers register the ops
    # (registration.cpp's PyInit__C is never called).
    cpp_extension.load(name=name, sources=[str(f) for f in files],
                       extra_include_paths=[str(CSRC)],
                       extra_cflags=[*CXX_FLAGS, *defect_flags(macro)],
                       extra_cuda_cflags=[*NVCC_FLAGS, *defect_flags(macro)],
                       is_python_module=False, verbose=verbose)
    return name


def links_libstdcxx_dynamically(cxx: str) -> bool | None:
    """Whether shared libraries built by ``cxx`` load the process's libstdc++ (None: unknown).

    A compiler that links libstdc++ statically (we met one: a toolchain under /opt/gcc set as
    $CXX on the GPU machines) gives the extension a private copy whose stream and locale state
    is never initialized: the first TORCH_CHECK message that formats a number then segfaults.
    """
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = Path(tmp) / "probe.cpp", Path(tmp) / "probe.so"
        src.write_text("#include <string>\nstd::string gpucheck_probe(long n) "
                       "{ return std::to_string(n); }\n")
        try:
            built = subprocess.run([cxx, "-shared", "-fPIC", str(src), "-o", str(lib)],
                                   capture_output=True, timeout=120)
            if built.returncode != 0:
                return None
            dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                                 timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if dyn.returncode != 0:
            return None
        return "libstdc++.so" in dyn.stdout


def host_compiler_env() -> dict[str, str]:
    """CC/CXX to build the extension with: $CXX unless it links libstdc++ statically."""
    cxx = os.environ.get("CXX", "c++")
    if links_libstdcxx_dynamically(cxx) is not False:
        return {}
    for cand_cxx, cand_cc in (("/usr/bin/g++", "/usr/bin/gcc"), ("/usr/bin/c++", "/usr/bin/cc")):
        if Path(cand_cxx).exists() and links_libstdcxx_dynamically(cand_cxx):
            print(f"gpucheck: $CXX={cxx} links libstdc++ statically, which makes the extension "
                  f"crash when it raises an error; building with {cand_cxx} instead",
                  file=sys.stderr)
            return {"CXX": cand_cxx, "CC": cand_cc}
    print(f"gpucheck: warning: $CXX={cxx} links libstdc++ statically and no other compiler "
          "was found; errors raised by the extension may crash the process", file=sys.stderr)
    return {}


def _cuda_home() -> Path | None:
    """The CUDA toolkit root: $CUDA_HOME, /usr/local/cuda, or two levels above nvcc."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for c in candidates:
        if c and (Path(c) / "bin" / "nvcc").exists():
            return Path(c)
    found = shutil.which("nvcc")
    return Path(found).resolve().parent.parent if found else None


def check_only_sources() -> list[Path]:
    """CUDA sources built elsewhere (JIT, by the harness's self-test) but compile-checked too."""
    selftest = CSRC.parent / "suites" / "selftest"
    if not selftest.is_dir():
        return []
    return sorted(selftest.glob("*.cpp")) + sorted(selftest.glob("*.cu"))


def _torch_compile_env(cuda_home: Path) -> tuple[list[str], list[str]]:
    """Include flags and the nvcc flags torch itself adds for extensions."""
    import sysconfig

    import torch
    from torch.utils import cpp_extension

    # include_paths("cpu"): a CPU build of torch knows no toolkit, so add its include dir here.
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    includes += [f"-I{cuda_home / 'include'}", f"-I{CSRC}",
                 f"-I{sysconfig.get_paths()['include']}"]
    torch_include = Path(cpp_extension.include_paths()[0])
    if not (torch_include / "c10/cuda/impl/cuda_cmake_macros.h").exists():
        # CPU wheels ship c10/cuda headers but not this one generated file; recreate it with
        # the content a CUDA build generates, in a private include dir.
        shim = Path(tempfile.mkdtemp(prefix="gpucheck-shim-"))
        (shim / "c10/cuda/impl").mkdir(parents=True)
        (shim / "c10/cuda/impl/cuda_cmake_macros.h").write_text(
            "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"
        )
        includes.append(f"-I{shim}")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    common = [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_EXTENSION_NAME=_C", "-std=c++20"]
    return includes + common, list(cpp_extension.COMMON_NVCC_FLAGS)


def compile_check(jobs: int = 2) -> int:
    """Compile (not link) every source for sm_90 against torch's headers. Returns an exit code.

    Works on machines without a GPU: the CPU wheel of torch ships the CUDA headers, and nvcc
    compiles .cu files without a device.
    """
    cuda_home = _cuda_home()
    if cuda_home is None:
        print("compile check: nvcc not found (set CUDA_HOME or put nvcc on PATH)", file=sys.stderr)
        return 2
    nvcc = str(cuda_home / "bin" / "nvcc")
    files = sources() + check_only_sources()
    if not files:
        print("compile check: csrc/ has no sources yet; nothing to compile")
        return 0
    includes, torch_nvcc = _torch_compile_env(cuda_home)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        procs: list[tuple[Path, list[str], subprocess.Popen[bytes], float]] = []
        pending = list(files)
        while pending or procs:
            while pending and len(procs) < jobs:
                src = pending.pop(0)
                obj = Path(tmp) / (src.stem + src.suffix.replace(".", "_") + ".o")
                if src.suffix == ".cu":
                    cmd = [nvcc, "-c", str(src), "-o", str(obj), *CHECK_ARCH, *NVCC_FLAGS,
                           *torch_nvcc, *includes, "-Xcompiler", "-fPIC"]
                else:
                    cmd = [nvcc, "-x", "c++", "-c", str(src), "-o", str(obj), *CXX_FLAGS,
                           *includes, "-Xcompiler", "-fPIC"]
                procs.append((src, cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                         stderr=subprocess.STDOUT),
                              time.monotonic()))
            src, cmd, proc, start = procs.pop(0)
            out, _ = proc.communicate()
            rel = src.relative_to(CSRC.parent) if CSRC.parent in src.parents else src
            took = time.monotonic() - start
            if proc.returncode == 0:
                print(f"compiled {rel} ({took:.1f} s)")
                if out.strip():
                    print(out.decode(errors="replace"))
            else:
                failures += 1
                print(f"FAILED   {rel}\n  {' '.join(cmd)}\n{out.decode(errors='replace')}")
    print(f"compile check: {len(files) - failures} of {len(files)} sources compiled for sm_90")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compile-only check of gpucheck's CUDA sources")
    parser.add_argument("--jobs", type=int, default=max(1, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    return compile_check(args.jobs)


if __name__ == "__main__":
    sys.exit(main())
