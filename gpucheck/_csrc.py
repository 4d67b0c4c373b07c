"""Where the CUDA sources are and how they are compiled: the one place setup.py, the JIT
build of the kernels (gpucheck.ops._ext) and the compile-only check (``nox -s compile`` /
``python -m gpucheck._csrc``) read.

The sources are the bundled ``gpucheck.csrc`` (gpucheck._resources). This module must not
import torch or gpucheck at import time: setup.py loads it by path and passes its own csrc/.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

EXTENSION_NAME = "gpucheck._C"
#: Environment variable selecting a subset of kernels (comma separated folder names of csrc/).
KERNELS_ENV = "GPUCHECK_KERNELS"
#: Environment variable naming gpucheck's build cache (default: $XDG_CACHE_HOME/gpucheck, or
#: ~/.cache/gpucheck).
CACHE_ENV = "GPUCHECK_CACHE_DIR"

CXX_FLAGS = ["-O3"]
NVCC_FLAGS = ["-O3", "-lineinfo", "--expt-relaxed-constexpr", "-Xptxas=-warn-spills"]
#: Architecture for the compile-only check (builds use TORCH_CUDA_ARCH_LIST or arch_list()).
CHECK_ARCH = ["-gencode=arch=compute_90,code=sm_90"]
#: What a build for no GPU in particular (TORCH_CUDA_ARCH_LIST unset, no GPU visible, e.g. an
#: install on a build machine) compiles for: the current data-centre generations (A100,
#: H100/H200, B200) and consumer ones (RTX 30, RTX 40 / L4 / L40, RTX 50), the newest also as
#: PTX, which the driver compiles for later GPUs; only those the toolkit's nvcc supports.
DEFAULT_ARCHS = ("8.0", "8.6", "8.9", "9.0", "10.0", "12.0")


def csrc_dir() -> Path:
    """The CUDA sources of the installed package (``gpucheck.csrc``)."""
    from gpucheck import _resources

    return _resources.csrc()


def example_csrc_dir() -> Path:
    """The sources of the worked example's extension (``examples/custom_rnn_extension/csrc``)."""
    from gpucheck import _resources

    return _resources.example() / "csrc"


def kernels(csrc: Path | None = None) -> list[str]:
    """Names of the kernel folders of ``csrc`` (default: the bundled one) that hold sources,
    honouring GPUCHECK_KERNELS."""
    csrc = csrc_dir() if csrc is None else csrc
    found = (
        sorted(
            p.name
            for p in csrc.iterdir()
            if p.is_dir() and (any(p.glob("*.cu")) or any(p.glob("*.cpp")))
        )
        if csrc.is_dir()
        else []
    )
    wanted = [k.strip() for k in os.environ.get(KERNELS_ENV, "").split(",") if k.strip()]
    if wanted:
        unknown = sorted(set(wanted) - set(found))
        if unknown:
            raise SystemExit(f"{KERNELS_ENV} names unknown kernels {unknown}; csrc/ has {found}")
        return [k for k in found if k in wanted]
    return found


def sources(csrc: Path | None = None) -> list[Path]:
    """All translation units of the extension: csrc/*.cpp plus csrc/<kernel>/*.{cpp,cu} (of
    ``csrc``, default: the bundled one)."""
    csrc = csrc_dir() if csrc is None else csrc
    if not csrc.is_dir():
        return []
    files = sorted(csrc.glob("*.cpp"))
    for k in kernels(csrc):
        files += sorted((csrc / k).glob("*.cpp")) + sorted((csrc / k).glob("*.cu"))
    return files


@dataclass(frozen=True)
class DefectBuild:
    """A deliberate defect: the macro that plants it and the kernel folder built with it."""

    macro: str
    kernel: str


#: Deliberate defects compiled from the same sources (csrc/README.md), by name. One macro may
#: plant its defect in several kernels (one build each). A build's ops register as
#: ``torch.ops.gpucheck_defect_<name>.*`` (:func:`defect_library`).
DEFECTS: dict[str, DefectBuild] = {
    "legacy_stream": DefectBuild("GPUCHECK_DEFECT_LEGACY_STREAM", "ssim"),
    "no_guard_ssim": DefectBuild("GPUCHECK_DEFECT_NO_GUARD", "ssim"),
    "shared_oob": DefectBuild("GPUCHECK_DEFECT_SHARED_OOB", "ssim"),
    "no_sync": DefectBuild("GPUCHECK_DEFECT_NO_SYNC", "ssim"),
    "no_guard_knn": DefectBuild("GPUCHECK_DEFECT_NO_GUARD", "knn"),
    "set_device": DefectBuild("GPUCHECK_DEFECT_SET_DEVICE", "knn"),
    "output_current_device": DefectBuild("GPUCHECK_DEFECT_OUTPUT_CURRENT_DEVICE", "knn"),
    "uninit_read": DefectBuild("GPUCHECK_DEFECT_UNINIT_READ", "knn"),
    "nondeterminism": DefectBuild("GPUCHECK_DEFECT_NONDETERMINISM", "knn"),
    "buffers_current_device": DefectBuild("GPUCHECK_DEFECT_BUFFERS_CURRENT_DEVICE", "splat"),
}


def defect_name(defect: str) -> str:
    """The name in :data:`DEFECTS` of ``defect``: a name, or a macro that plants one defect
    only (``GPUCHECK_DEFECT_LEGACY_STREAM`` -> ``legacy_stream``)."""
    if defect in DEFECTS:
        return defect
    named = [n for n, d in DEFECTS.items() if d.macro == defect]
    if len(named) == 1:
        return named[0]
    if named:
        raise KeyError(f"{defect} builds against several kernels; name one of {named}")
    raise KeyError(f"unknown defect {defect!r}; known: {sorted(DEFECTS)}")


def defect_library(defect: str) -> str:
    """The op namespace of a defect build (``torch.ops.<it>.*``), unique per build: the real
    extension keeps ``gpucheck``, so every build loads next to it in one process."""
    return "gpucheck_defect_" + defect_name(defect)


def defect_flags(defect: str) -> list[str]:
    """Compiler flags of the defect build of ``defect`` (C++ and nvcc alike)."""
    return [
        f"-D{DEFECTS[defect_name(defect)].macro}",
        f"-DGPUCHECK_LIBRARY={defect_library(defect)}",
    ]


def defect_sources(defect: str) -> list[Path]:
    """Translation units of a defect build: csrc/*.cpp (the schemas) and its kernel folder."""
    csrc = csrc_dir()
    kernel = csrc / DEFECTS[defect_name(defect)].kernel
    return sorted(csrc.glob("*.cpp")) + sorted(kernel.glob("*.cpp")) + sorted(kernel.glob("*.cu"))


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _mentions(path: Path, word: str, seen: set[Path] | None = None) -> bool:
    """Whether ``path`` or a header it includes with quotes (found in csrc/ or next to it)
    names ``word``."""
    seen = set() if seen is None else seen
    if path in seen or not path.is_file():
        return False
    seen.add(path)
    text = path.read_text(errors="replace")
    if word in text:
        return True
    return any(
        _mentions(base / inc, word, seen)
        for inc in _INCLUDE.findall(text)
        for base in (csrc_dir(), path.parent)
    )


def defect_units(defect: str) -> list[Path]:
    """The sources of a defect build that its macro changes (what the compile check compiles
    again under the macro); empty when no source names the macro."""
    macro = DEFECTS[defect_name(defect)].macro
    kernel = csrc_dir() / DEFECTS[defect_name(defect)].kernel
    return [f for f in defect_sources(defect) if f.parent == kernel and _mentions(f, macro)]


def build_defect(defect: str, verbose: bool = False) -> str:
    """JIT-build (``torch.utils.cpp_extension.load``, into :func:`build_dir`) and load the
    defect build ``defect`` (a name of :data:`DEFECTS`, or a macro that plants one defect
    only): registration.cpp and its kernel folder, compiled with :func:`defect_flags`. Returns
    the op namespace (``torch.ops.<namespace>.<op>``). Needs a CUDA toolkit and a CUDA torch.
    """
    from torch.utils import cpp_extension

    torch_build_env()  # the same compiler and toolkit rule as setup.py
    name = defect_library(defect)
    flags = defect_flags(defect)
    # is_python_module=False: a plain library whose static initializers register the ops
    # (registration.cpp's PyInit__C is never called).
    cpp_extension.load(
        name=name,
        sources=[str(f) for f in defect_sources(defect)],
        extra_include_paths=[str(csrc_dir())],
        extra_cflags=[*CXX_FLAGS, *flags],
        extra_cuda_cflags=[*NVCC_FLAGS, *flags],
        is_python_module=False,
        build_directory=str(build_dir(name)),
        verbose=verbose,
    )
    return name


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


def _cuda_home() -> Path | None:
    """The CUDA toolkit root of this machine (:func:`find_cuda_home`)."""
    return find_cuda_home(os.environ, shutil.which("nvcc"), default=DEFAULT_CUDA_HOME)


def torch_build_env() -> Path | None:
    """Prepare this process for a ``torch.utils.cpp_extension`` build of our sources: the
    host compiler of :func:`host_compiler_env`, and the toolkit of :func:`_cuda_home` as
    torch's CUDA_HOME (torch's own guess fails for an nvcc wrapper script). Returns the
    toolkit's root (None: none found)."""
    os.environ.update(host_compiler_env())
    home = _cuda_home()
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


#: the self-test's pybind11 extension (suites/selftest/pybind_defects.{cpp,cu}): its defect
#: builds by name -> the macro that plants the defect; ``clean`` is the build without one
PYBIND_DEFECTS = {
    "legacy_stream": "GPUCHECK_PYBIND_DEFECT_LEGACY_STREAM",
    "cub_stream0": "GPUCHECK_PYBIND_DEFECT_CUB_STREAM0",
    "output_current_device": "GPUCHECK_PYBIND_DEFECT_OUTPUT_CURRENT_DEVICE",
    "set_device": "GPUCHECK_PYBIND_DEFECT_SET_DEVICE",
}
PYBIND_CLEAN = "clean"
PYBIND_SOURCES = ("pybind_defects.cpp", "pybind_defects.cu")


def pybind_sources() -> list[Path]:
    """The sources of the self-test's pybind11 extension."""
    from gpucheck import _resources

    return [_resources.suites() / "selftest" / name for name in PYBIND_SOURCES]


def pybind_module_name(build: str) -> str:
    """The Python module name of a build of the self-test's pybind11 extension (``clean`` or
    a name of :data:`PYBIND_DEFECTS`): ``gpucheck_pybind_<build>``."""
    if build != PYBIND_CLEAN and build not in PYBIND_DEFECTS:
        raise KeyError(
            f"unknown pybind build {build!r}; known: {[PYBIND_CLEAN, *sorted(PYBIND_DEFECTS)]}"
        )
    return f"gpucheck_pybind_{build}"


def pybind_flags(build: str) -> list[str]:
    """Compiler flags of a build of the self-test's pybind11 extension (C++ and nvcc)."""
    pybind_module_name(build)  # a known build
    return [f"-D{PYBIND_DEFECTS[build]}"] if build in PYBIND_DEFECTS else []


def build_pybind(build: str, verbose: bool = False) -> object:
    """JIT-build (``torch.utils.cpp_extension.load``, into :func:`build_dir`) and import a
    build of the self-test's pybind11 extension: ``clean`` or a name of
    :data:`PYBIND_DEFECTS`. Returns the module (a ``PYBIND11_MODULE``, not ``torch.ops``).
    Needs a CUDA toolkit and a CUDA torch."""
    from torch.utils import cpp_extension

    torch_build_env()
    name = pybind_module_name(build)
    flags = pybind_flags(build)
    return cpp_extension.load(
        name=name,
        sources=[str(f) for f in pybind_sources()],
        extra_cflags=[*CXX_FLAGS, *flags],
        extra_cuda_cflags=[*NVCC_FLAGS, *flags],
        build_directory=str(build_dir(name)),
        verbose=verbose,
    )


def pybind_defect_units() -> list[tuple[Path, list[str], str]]:
    """(source, flags, label) of the pybind defect builds: each source that names the
    build's macro, compiled again under it (compile-checked like ours)."""
    return [
        (src, pybind_flags(name), f" [pybind {name}]")
        for name, macro in PYBIND_DEFECTS.items()
        for src in pybind_sources()
        if src.is_file() and macro in src.read_text()
    ]


#: the example extension's defect macros and the sources each changes
EXAMPLE_DEFECTS = {
    "no_guard": ("wkv.cpp",),
    "bf16_accum": ("wkv.cpp", "wkv_cuda.cu"),
    "grad_current_device": ("wkv.cpp",),
}


def example_defect_units() -> list[tuple[Path, list[str], str]]:
    """(source, flags, label) of the example's defect builds (compile-checked like ours)."""
    example = example_csrc_dir()
    if not example.is_dir():
        return []
    return [
        (example / f, [f"-DCUSTOM_RNN_DEFECT_{name.upper()}"], f" [example {name}]")
        for name, files in EXAMPLE_DEFECTS.items()
        for f in files
    ]


def _torch_compile_env(cuda_home: Path) -> tuple[list[str], list[str]]:
    """Include flags and the nvcc flags torch itself adds for extensions."""
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
        shim = Path(tempfile.mkdtemp(prefix="gpucheck-shim-"))
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
        from gpucheck import _zoo  # imports this module: the zoo's builds live apart

        units += example_defect_units() + pybind_defect_units() + _zoo.defect_units()
        missing += [
            f"pybind {name}: no source of the self-test's pybind extension names {macro}"
            for name, macro in PYBIND_DEFECTS.items()
            if not any(label == f" [pybind {name}]" for *_, label in units)
        ]
        missing += _zoo.missing()
    return units, missing


def compile_check(jobs: int = 2, defects: str = "with") -> int:
    """Compile (not link) every source for sm_90 against torch's headers, and again every
    source a defect macro changes under that macro (see :func:`check_units`). Returns an exit
    code.

    Works on machines without a GPU: the CPU wheel of torch ships the CUDA headers, and nvcc
    compiles .cu files without a device.
    """
    cuda_home = _cuda_home()
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
    includes, torch_nvcc = _torch_compile_env(cuda_home)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        procs: list[tuple[Path, str, list[str], subprocess.Popen[bytes], float]] = []
        pending = list(enumerate(units))
        while pending or procs:
            while pending and len(procs) < jobs:
                i, (src, flags, label) = pending.pop(0)
                obj = Path(tmp) / f"{i}_{src.stem}{src.suffix.replace('.', '_')}.o"
                if src.suffix == ".cu":
                    cmd = [
                        nvcc,
                        "-c",
                        str(src),
                        "-o",
                        str(obj),
                        *CHECK_ARCH,
                        *NVCC_FLAGS,
                        *torch_nvcc,
                        *includes,
                        *flags,
                        "-Xcompiler",
                        "-fPIC",
                    ]
                else:
                    cmd = [
                        nvcc,
                        "-x",
                        "c++",
                        "-c",
                        str(src),
                        "-o",
                        str(obj),
                        *CXX_FLAGS,
                        *includes,
                        *flags,
                        "-Xcompiler",
                        "-fPIC",
                    ]
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


if __name__ == "__main__":
    sys.exit(main())
