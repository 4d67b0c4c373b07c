"""The self-test's pybind11 extension (``suites/selftest/pybind_defects.{cpp,cu}``): its clean
build and its defect builds, each behind one ``GPUCHECK_PYBIND_DEFECT_*`` macro."""

from __future__ import annotations

from pathlib import Path

from gpucheck._csrc.toolchain import CXX_FLAGS, NVCC_FLAGS, build_dir, torch_build_env

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
