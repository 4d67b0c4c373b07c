"""Build gpucheck's CUDA extension (gpucheck._C) when a CUDA build of torch is importable.

Metadata lives in pyproject.toml. Install with ``pip install --no-build-isolation -e .`` on a
machine with CUDA so that this file can see your torch; set TORCH_CUDA_ARCH_LIST (e.g. 9.0)
and MAX_JOBS to control the build, GPUCHECK_KERNELS=ssim,knn to build a subset, and
GPUCHECK_NO_EXTENSION=1 to skip it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def _csrc():
    spec = importlib.util.spec_from_file_location("_gpucheck_csrc", HERE / "gpucheck" / "_csrc.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def _skip(reason: str) -> dict:
    print(f"gpucheck: not building the CUDA extension: {reason}", file=sys.stderr)
    return {}


def extension_kwargs() -> dict:
    if os.environ.get("GPUCHECK_NO_EXTENSION") == "1":
        return _skip("GPUCHECK_NO_EXTENSION=1")
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:
        return _skip("torch is not importable here (install with --no-build-isolation)")
    if torch.version.cuda is None:
        return _skip(f"torch {torch.__version__} is a CPU-only build")
    if CUDA_HOME is None:
        return _skip("no CUDA toolkit found (set CUDA_HOME)")
    csrc = _csrc()
    sources = [str(p.relative_to(HERE)) for p in csrc.sources()]
    if not sources:
        return _skip("csrc/ has no sources")
    os.environ.update(csrc.host_compiler_env())

    class Build(BuildExtension):
        """Always rebuild (a previous build may hold another kernel selection), and in
        editable installs put gpucheck/_C*.so next to the sources, where `import gpucheck`
        from the checkout finds it."""

        def finalize_options(self) -> None:
            super().finalize_options()
            self.force = True

        def run(self) -> None:
            super().run()
            if getattr(self, "editable_mode", False) and not self.inplace:
                self.copy_extensions_to_source()

    ext = CUDAExtension(
        name=csrc.EXTENSION_NAME,
        sources=sources,
        include_dirs=[str(csrc.CSRC)],
        extra_compile_args={"cxx": csrc.CXX_FLAGS, "nvcc": csrc.NVCC_FLAGS},
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": Build}}


setup(**extension_kwargs())
