"""The deliberate defects of the bundled kernels (csrc/README.md): each compiled from the same
sources behind one ``GPUCHECK_DEFECT_*`` macro, declared in its kernel's home
(``gpucheck/kernels/<kernel>/defects.py``), JIT-built for the self-test; and the worked
example's defect builds, which only the compile check compiles."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpucheck import kernels
from gpucheck._csrc.sources import csrc_dir, example_csrc_dir, mentions
from gpucheck._csrc.toolchain import CXX_FLAGS, NVCC_FLAGS, build_dir, torch_build_env


@dataclass(frozen=True)
class DefectBuild:
    """A deliberate defect: the macro that plants it and the kernel folder built with it."""

    macro: str
    kernel: str


def planted() -> dict[str, DefectBuild]:
    """Every kernel home's ``DEFECTS`` (``gpucheck/kernels/<kernel>/defects.py``), each build
    with the kernel folder it is built from.

    Raises:
        ValueError: two homes name a build alike.
    """
    found: dict[str, DefectBuild] = {}
    for kernel in kernels.names():
        module = kernels.part(kernel, "defects")
        for name, macro in getattr(module, "DEFECTS", {}).items():
            if name in found:
                raise ValueError(
                    f"defect build {name!r} is planted in both {found[name].kernel} and {kernel}"
                )
            found[name] = DefectBuild(macro, kernel)
    return found


#: Deliberate defects compiled from the same sources (csrc/README.md), by name, from the kernel
#: homes. One macro may plant its defect in several kernels (one build each). A build's ops
#: register as ``torch.ops.gpucheck_defect_<name>.*`` (:func:`defect_library`).
DEFECTS: dict[str, DefectBuild] = planted()


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


def defect_units(defect: str) -> list[Path]:
    """The sources of a defect build that its macro changes (what the compile check compiles
    again under the macro); empty when no source names the macro."""
    macro = DEFECTS[defect_name(defect)].macro
    kernel = csrc_dir() / DEFECTS[defect_name(defect)].kernel
    return [f for f in defect_sources(defect) if f.parent == kernel and mentions(f, macro)]


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
