"""Build gpucheck: the package, with the folders it ships mapped into it (csrc/, suites/ and
examples/ of this repository become gpucheck.csrc, gpucheck.suites, gpucheck.examples), and
its CUDA kernels (gpucheck._C) when a CUDA build of torch and a CUDA toolkit are found here.

Metadata lives in pyproject.toml. The kernels are built at install only where this file can
import your torch (``pip install --no-build-isolation .``) and a GPU is visible (or the build
is asked for: GPUCHECK_BUILD_EXTENSION=1, TORCH_CUDA_ARCH_LIST); anywhere else, and where
their build fails, gpucheck installs without them and builds them on first use instead. The
knobs (GPUCHECK_NO_EXTENSION, GPUCHECK_BUILD_EXTENSION, GPUCHECK_KERNELS,
TORCH_CUDA_ARCH_LIST, MAX_JOBS, CUDA_HOME) are in docs/install.md.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from setuptools import find_namespace_packages, setup

HERE = Path(__file__).resolve().parent


def _load(name: str) -> ModuleType:
    """gpucheck/<name>.py (``name`` may name a subfolder: ``_csrc/toolchain``), loaded by path:
    gpucheck itself is not importable while it builds."""
    spec = importlib.util.spec_from_file_location(
        "_gpucheck_" + name.replace("/", "_"), HERE / "gpucheck" / f"{name}.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def package_kwargs() -> dict[str, Any]:
    """The packages, with the bundled folders mapped in, and the files they carry."""
    resources = _load("_resources")
    bundled = {f"gpucheck.{name}": folder for name, folder in resources.BUNDLED.items()}
    found = find_namespace_packages(include=["gpucheck", "gpucheck.*"], exclude=["*.__pycache__"])
    return {
        "packages": [*found, *bundled],
        "package_dir": bundled,
        "package_data": {
            "gpucheck": ["model/*.json", "report/templates/*", "detectors/*.cpp"],
            **{package: resources.BUNDLED_FILES for package in bundled},
        },
        "include_package_data": False,
    }


def _say(message: str, loud: bool = False) -> None:
    """One line on stderr; ``loud``: also on the terminal pip runs in (pip shows a build's
    output only with -v, and a build of minutes must not hide behind "still running")."""
    print(f"gpucheck: {message}", file=sys.stderr)
    if loud and not sys.stderr.isatty():
        try:
            with open("/dev/tty", "w") as tty:
                tty.write(f"gpucheck: {message}\n")
        except OSError:  # no terminal (a CI log): stderr it is
            pass


#: what the temporary folders of an isolated build environment are named: pip's and
#: ``python -m build``'s (they hold the build's requirements only, never your torch)
ISOLATED_ENVS = ("pip-build-env-", "build-env-")


def _isolated() -> bool:
    """Whether this build runs in an isolated build environment (where your torch is not)."""
    return any(m in p for p in [sys.prefix, *sys.path] for m in ISOLATED_ENVS)


def _skip(reason: str) -> dict[str, Any]:
    _say(f"not building the CUDA kernels at install ({reason}); they are built on first use")
    return {}


def build_command(base: type) -> type:
    """torch's BuildExtension (``base``), made to always rebuild (a previous build may hold
    another kernel selection), to put gpucheck/_C*.so next to the sources in editable
    installs, and to install without the kernels, saying so in one line, where their build
    fails."""

    class Build(base):
        def finalize_options(self) -> None:
            super().finalize_options()
            self.force = True

        def run(self) -> None:
            try:
                super().run()
            except Exception as err:  # a compiler's, torch's or the toolkit's error alike
                first = str(err).strip().splitlines()
                self.extensions = []  # nothing to install, nothing to copy
                _say(
                    f"building the CUDA kernels failed ({first[0] if first else repr(err)}); "
                    "installing without them: they are built on first use (pip install -v "
                    "shows the compiler's output)"
                )
                return
            if getattr(self, "editable_mode", False) and not self.inplace:
                self.copy_extensions_to_source()

    return Build


def extension_kwargs() -> dict[str, Any]:
    """The CUDA extension and its build command, or nothing (with the reason said once)."""
    if os.environ.get("GPUCHECK_NO_EXTENSION") == "1":
        return _skip("GPUCHECK_NO_EXTENSION=1")
    try:
        import torch
    except ImportError:
        if _isolated():
            return _skip(
                "this build runs in an isolated build environment (pip's or `python -m "
                "build`'s), which does not see your torch; to build them at install, install "
                "torch first, then gpucheck with --no-build-isolation"
            )
        return _skip("torch is not installed in this environment: install torch first")
    if torch.version.cuda is None:
        return _skip(f"torch {torch.__version__} is a CPU-only build")
    asked = os.environ.get("GPUCHECK_BUILD_EXTENSION") == "1" or bool(
        os.environ.get("TORCH_CUDA_ARCH_LIST")
    )
    if not asked and not torch.cuda.is_available():
        return _skip(
            "no GPU is visible here; set GPUCHECK_BUILD_EXTENSION=1 or "
            "TORCH_CUDA_ARCH_LIST to build them anyway"
        )
    toolchain = _load("_csrc/toolchain")
    if toolchain.torch_build_env() is None:
        return _skip("no CUDA toolkit found: set CUDA_HOME or put nvcc on PATH")
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    root = HERE / "csrc"
    kernel_sources = _load("_csrc/sources")
    sources = [str(p.relative_to(HERE)) for p in kernel_sources.sources(root)]
    if not sources:
        return _skip("csrc/ has no sources")
    nvcc_flags = list(toolchain.NVCC_FLAGS)
    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):  # else torch's build reads it
        visible = (
            [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available()
            else []
        )
        archs = toolchain.arch_list(visible, toolchain.nvcc_archs(toolchain.cuda_home()))
        _say(
            f"building the CUDA kernels for {toolchain.arch_label(archs)} at install (a few "
            "minutes; GPUCHECK_NO_EXTENSION=1 builds them on first use instead)",
            loud=True,
        )
        nvcc_flags += toolchain.gencode_flags(archs)
    else:
        _say(
            f"building the CUDA kernels for TORCH_CUDA_ARCH_LIST="
            f"{os.environ['TORCH_CUDA_ARCH_LIST']} at install (a few minutes)",
            loud=True,
        )

    ext = CUDAExtension(
        name=kernel_sources.EXTENSION_NAME,
        sources=sources,
        include_dirs=[str(root)],
        extra_compile_args={"cxx": toolchain.CXX_FLAGS, "nvcc": nvcc_flags},
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": build_command(BuildExtension)}}


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it
    setup(**package_kwargs(), **extension_kwargs())
