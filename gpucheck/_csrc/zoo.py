"""The self-test's zoo (``suites/selftest/zoo/``): pybind11 extensions in the shape of the
field's code, one source family each (``zoo_<family>.cpp`` / ``.cu``), built with
``torch.utils.cpp_extension.load`` clean and with defect macros (``GPUCHECK_ZOO_<DEFECT>``),
and compile-checked by ``nox -s compile`` (:func:`gpucheck._csrc.compile_check.check_units`)
under each build's macros. ``gpucheck.selftest.ZOO`` says what each build's cases must draw.
"""

from __future__ import annotations

from pathlib import Path

from gpucheck._csrc import toolchain
from gpucheck._csrc.sources import mentions

#: the zoo's builds by name -> (family, the defects planted, each the macro
#: ``GPUCHECK_ZOO_<DEFECT>``); no defect: a clean twin
ZOO_BUILDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "raster_clean": ("raster", ()),
    "raster_noguard": ("raster", ("NO_GUARD",)),
    "raster_legacy_leak": ("raster", ("LEGACY_STREAM", "LEAK")),
    "raster_sort0_outdev": ("raster", ("SORT_STREAM0", "OUTPUT_CURRENT_DEVICE")),
    "raster_mask_unwritten": ("raster", ("MASK_UNWRITTEN",)),
    "raster_unwritten_assume_contiguous": ("raster", ("MASK_UNWRITTEN", "ASSUME_CONTIGUOUS")),
    "ssim_clean": ("ssim", ()),
    "ssim_noguard": ("ssim", ("NO_GUARD",)),
    "ssim_outdev_legacy": ("ssim", ("OUTPUT_CURRENT_DEVICE", "LEGACY_STREAM")),
    "ssim_assume_contiguous": ("ssim", ("ASSUME_CONTIGUOUS",)),
    "ssim_nosync": ("ssim", ("NO_SYNC",)),
    "knn_clean": ("knn", ()),
    "knn_noguard": ("knn", ("NO_GUARD",)),
    "knn_setdevice_thrust0": ("knn", ("SET_DEVICE", "THRUST_STREAM0")),
    "knn_noguard_thrust0": ("knn", ("NO_GUARD", "THRUST_STREAM0")),
    "rnn_clean": ("rnn", ()),
    "rnn_legacy": ("rnn", ("LEGACY_STREAM",)),
    "rnn_noguard_legacy": ("rnn", ("NO_GUARD", "LEGACY_STREAM")),
}


def zoo_dir() -> Path:
    """The zoo's folder in the installed package (``suites/selftest/zoo``)."""
    from gpucheck import _resources

    return _resources.suites() / "selftest" / "zoo"


def module_name(build: str) -> str:
    """The Python module (``TORCH_EXTENSION_NAME``) of a zoo build: ``gpucheck_zoo_<build>``
    (also the C++ namespace of its entry points and kernels)."""
    if build not in ZOO_BUILDS:
        raise KeyError(f"unknown zoo build {build!r}; known: {sorted(ZOO_BUILDS)}")
    return f"gpucheck_zoo_{build}"


def flags(build: str) -> list[str]:
    """Compiler flags of a zoo build (C++ and nvcc): one ``-DGPUCHECK_ZOO_<DEFECT>`` each."""
    module_name(build)  # a known build
    return [f"-DGPUCHECK_ZOO_{d}" for d in ZOO_BUILDS[build][1]]


def sources(build: str) -> list[Path]:
    """The translation units of a zoo build: its family's ``zoo_<family>.cpp`` and ``.cu``."""
    family = ZOO_BUILDS[build][0]
    return [zoo_dir() / f"zoo_{family}{suffix}" for suffix in (".cpp", ".cu")]


def build_zoo(build: str, verbose: bool = False) -> object:
    """JIT-build (``torch.utils.cpp_extension.load``, into gpucheck's build cache) and import a
    zoo build (a name of :data:`ZOO_BUILDS`). Returns the module (a ``PYBIND11_MODULE``).
    Needs a CUDA toolkit and a CUDA torch."""
    from torch.utils import cpp_extension

    toolchain.torch_build_env()
    name = module_name(build)
    extra = flags(build)
    return cpp_extension.load(
        name=name,
        sources=[str(f) for f in sources(build)],
        extra_include_paths=[str(zoo_dir())],
        extra_cflags=[*toolchain.CXX_FLAGS, *extra],
        extra_cuda_cflags=[*toolchain.NVCC_FLAGS, *extra],
        build_directory=str(toolchain.build_dir(name)),
        verbose=verbose,
    )


def _names(src: Path, defect: str) -> bool:
    return mentions(src, f"GPUCHECK_ZOO_{defect}")


def defect_units() -> list[tuple[Path, list[str], str]]:
    """(source, flags, label) of the zoo's defect builds for the compile check: each source of
    the build's family that names one of its macros (or includes a zoo header that does),
    compiled under all of the build's macros at once."""
    return [
        (src, flags(build), f" [zoo {build}]")
        for build, (_family, defects) in ZOO_BUILDS.items()
        if defects
        for src in sources(build)
        if any(_names(src, d) for d in defects)
    ]


def missing() -> list[str]:
    """The zoo's defects whose macro no source of their family names."""
    return [
        f"zoo {build}: no source of its family names GPUCHECK_ZOO_{d}"
        for build, (_family, defects) in ZOO_BUILDS.items()
        for d in defects
        if not any(_names(src, d) for src in sources(build))
    ]
