"""How the CUDA sources are compiled: the flags, the host compiler, the CUDA toolkit
(:func:`cuda_home`), the architectures to compile for, and gpucheck's build cache. The one
place setup.py, the JIT builds (gpucheck._csrc.extension, the self-test's builds) and the
compile-only check read.

This module must not import torch or gpucheck at import time: setup.py loads it by path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

CXX_FLAGS = ["-O3"]
NVCC_FLAGS = ["-O3", "-lineinfo", "--expt-relaxed-constexpr", "-Xptxas=-warn-spills"]
#: Architecture for the compile-only check (builds use TORCH_CUDA_ARCH_LIST or arch_list()).
CHECK_ARCH = ["-gencode=arch=compute_90,code=sm_90"]
#: What a build for no GPU in particular (TORCH_CUDA_ARCH_LIST unset, no GPU visible, e.g. an
#: install on a build machine) compiles for: the current data-centre generations (A100,
#: H100/H200, B200) and consumer ones (RTX 30, RTX 40 / L4 / L40, RTX 50), the newest also as
#: PTX, which the driver compiles for later GPUs; only those the toolkit's nvcc supports.
DEFAULT_ARCHS = ("8.0", "8.6", "8.9", "9.0", "10.0", "12.0")
#: Environment variable naming gpucheck's build cache (default: $XDG_CACHE_HOME/gpucheck, or
#: ~/.cache/gpucheck).
CACHE_ENV = "GPUCHECK_CACHE_DIR"


def links_libstdcxx_dynamically(cxx: str) -> bool | None:
    """Whether shared libraries built by ``cxx`` load the process's libstdc++ (None: unknown).

    A compiler that links libstdc++ statically (we met one: a toolchain under /opt/gcc set as
    $CXX on the GPU machines) gives the extension a private copy whose stream and locale state
    is never initialized: the first TORCH_CHECK message that formats a number then segfaults.
    """
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = Path(tmp) / "probe.cpp", Path(tmp) / "probe.so"
        src.write_text(
            "#include <string>\nstd::string gpucheck_probe(long n) { return std::to_string(n); }\n"
        )
        try:
            built = subprocess.run(
                [cxx, "-shared", "-fPIC", str(src), "-o", str(lib)],
                capture_output=True,
                timeout=120,
            )
            if built.returncode != 0:
                return None
            dyn = subprocess.run(
                ["readelf", "-d", str(lib)], capture_output=True, text=True, timeout=60
            )
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
            print(
                f"gpucheck: $CXX={cxx} links libstdc++ statically, which makes the extension "
                f"crash when it raises an error; building with {cand_cxx} instead",
                file=sys.stderr,
            )
            return {"CXX": cand_cxx, "CC": cand_cc}
    print(
        f"gpucheck: warning: $CXX={cxx} links libstdc++ statically and no other compiler "
        "was found; errors raised by the extension may crash the process",
        file=sys.stderr,
    )
    return {}


def _is_toolkit(root: Path) -> bool:
    return (root / "bin" / "nvcc").exists() and (root / "include" / "cuda_runtime_api.h").exists()


def _nvcc_top(nvcc: str) -> Path | None:
    """The toolkit an nvcc belongs to, as nvcc itself reports it (``--dryrun`` prints the
    folder of the real nvcc binary): the way through a wrapper script on PATH."""
    try:
        out = subprocess.run(
            [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"^#\$ _HERE_=(.+)$", out.stdout + out.stderr, re.M)
    return Path(found.group(1).strip()).parent if found else None


def find_cuda_home(
    env: Mapping[str, str],
    nvcc_on_path: str | None,
    ask_nvcc: Callable[[str], Path | None] = _nvcc_top,
    default: Path = Path("/usr/local/cuda"),
) -> Path | None:
    """The CUDA toolkit root: $CUDA_HOME or $CUDA_PATH (when it holds bin/nvcc), else the
    toolkit of the nvcc on PATH, else ``default``; None without any.

    The toolkit of the nvcc on PATH is two levels above it (after symlinks) when that folder
    holds the toolkit's headers; otherwise nvcc is a wrapper script (``/usr/local/bin/nvcc``
    that execs the real one) and ``ask_nvcc`` says where the real one lives. torch guesses
    the two levels above in every case, which is how it ends up with CUDA_HOME=/usr/local.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = env.get(var)
        if value and (Path(value) / "bin" / "nvcc").exists():
            return Path(value)
    if nvcc_on_path:
        root = Path(nvcc_on_path).resolve().parent.parent
        if _is_toolkit(root):
            return root
        asked = ask_nvcc(nvcc_on_path)
        if asked is not None and _is_toolkit(asked):
            return asked
    return default if _is_toolkit(default) else None


#: where a CUDA toolkit is looked for last
DEFAULT_CUDA_HOME = Path("/usr/local/cuda")


def cuda_home() -> Path | None:
    """The CUDA toolkit root of this machine (:func:`find_cuda_home`)."""
    return find_cuda_home(os.environ, shutil.which("nvcc"), default=DEFAULT_CUDA_HOME)


def torch_build_env() -> Path | None:
    """Prepare this process for a ``torch.utils.cpp_extension`` build of our sources: the
    host compiler of :func:`host_compiler_env`, and the toolkit of :func:`cuda_home` as
    torch's CUDA_HOME (torch's own guess fails for an nvcc wrapper script). Returns the
    toolkit's root (None: none found)."""
    os.environ.update(host_compiler_env())
    home = cuda_home()
    if home is not None:
        from torch.utils import cpp_extension

        os.environ["CUDA_HOME"] = str(home)
        cpp_extension.CUDA_HOME = str(home)  # read by every build step; set once at import
    return home


def _arch_key(arch: str) -> tuple[int, int]:
    major, _, minor = arch.removesuffix("+PTX").partition(".")
    return int(major), int(minor[:1] or 0)


def parse_gpu_archs(text: str) -> list[str]:
    """The architectures in the output of ``nvcc --list-gpu-arch`` (``compute_90`` ->
    ``9.0``), oldest first."""
    found = {f"{m[:-1]}.{m[-1]}" for m in re.findall(r"^\s*compute_(\d{2,3})\s*$", text, re.M)}
    return sorted(found, key=_arch_key)


def nvcc_archs(cuda_home: Path) -> list[str] | None:
    """The architectures the toolkit's nvcc compiles for; None when it cannot say (an nvcc
    older than CUDA 11 has no ``--list-gpu-arch``)."""
    try:
        out = subprocess.run(
            [str(cuda_home / "bin" / "nvcc"), "--list-gpu-arch"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (parse_gpu_archs(out.stdout) if out.returncode == 0 else []) or None


def arch_list(visible: list[tuple[int, int]], supported: list[str] | None) -> list[str]:
    """What to compile for when TORCH_CUDA_ARCH_LIST is not set: the architectures of the
    visible GPUs (``visible``: their compute capabilities), else :data:`DEFAULT_ARCHS`, the
    newest with ``+PTX``. Only what nvcc supports (``supported``; None: unknown, all): a GPU
    newer than nvcc gets nvcc's newest architecture as PTX, which its driver compiles."""
    newest = max(supported, key=_arch_key) if supported else None
    if visible:
        wanted = {f"{major}.{minor}" for major, minor in visible}
        chosen = sorted(
            {a if supported is None or a in supported else f"{newest}+PTX" for a in wanted},
            key=_arch_key,
        )
        return chosen
    chosen = [a for a in DEFAULT_ARCHS if supported is None or a in supported] or [str(newest)]
    return [*chosen[:-1], chosen[-1] + "+PTX"]


def parse_arch_env(value: str) -> list[str] | None:
    """The architectures of a TORCH_CUDA_ARCH_LIST (``"8.0;9.0+PTX"``, or space separated);
    None when it uses torch's names (``Hopper``), which only torch's build reads."""
    archs = [a for a in re.split(r"[;\s]+", value.strip()) if a]
    ok = all(re.fullmatch(r"\d+\.\d(\+PTX)?", a) for a in archs)
    return archs if archs and ok else None


def gencode_flags(archs: list[str]) -> list[str]:
    """nvcc's flags for ``archs`` (``9.0``: sm_90 code; ``12.0+PTX``: sm_120 code and
    compute_120 PTX). Given to torch's build, they replace its own choice."""
    flags = []
    for arch in archs:
        num = arch.removesuffix("+PTX").replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if arch.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def arch_label(archs: list[str]) -> str:
    """``["8.0", "9.0+PTX"]`` -> ``sm_80, sm_90 (+PTX)``."""
    names = [f"sm_{a.removesuffix('+PTX').replace('.', '')}" for a in archs]
    return ", ".join(names) + (" (+PTX)" if any(a.endswith("+PTX") for a in archs) else "")


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """gpucheck's build cache: $GPUCHECK_CACHE_DIR, else $XDG_CACHE_HOME/gpucheck, else
    ~/.cache/gpucheck. Nothing is ever built inside the installed package."""
    env = os.environ if env is None else env
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "gpucheck"


def build_dir(name: str, make: bool = True) -> Path:
    """The cache folder of the build ``name`` for this torch, CUDA and Python (a build made
    for one does not load in another), made if missing (OSError when it cannot be) unless
    ``make`` is False."""
    import torch

    key = (
        f"torch{torch.__version__}-cuda{torch.version.cuda}"
        f"-py{sys.version_info[0]}{sys.version_info[1]}"
    )
    folder = cache_dir() / re.sub(r"[^\w.+-]", "_", key) / re.sub(r"[^\w.+-]", "_", name)
    if make:
        folder.mkdir(parents=True, exist_ok=True)
    return folder
