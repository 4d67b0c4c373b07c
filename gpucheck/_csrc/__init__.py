"""The bundled CUDA sources and how they are built, one room each: where the sources are
(:mod:`~gpucheck._csrc.sources`), the compiler, toolkit, architectures and build cache
(:mod:`~gpucheck._csrc.toolchain`), loading the kernels' build, made at install or on first use
(:mod:`~gpucheck._csrc.extension`), the self-test's defect builds of the kernels, planted in
their homes (:mod:`~gpucheck._csrc.defects`), its pybind11 extension
(:mod:`~gpucheck._csrc.pybind`) and its zoo (:mod:`~gpucheck._csrc.zoo`), and the compile-only
check (:mod:`~gpucheck._csrc.compile_check`, ``python -m gpucheck._csrc``).

``sources`` and ``toolchain`` import neither torch nor gpucheck at import time: setup.py
loads them by path while gpucheck builds.
"""
