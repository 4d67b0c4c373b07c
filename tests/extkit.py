"""Small C++ torch extensions built on CPU for the tests (``torch.utils.cpp_extension.
load_inline``): a ``PYBIND11_MODULE`` that links libc10 / libtorch the way a CUDA extension
does, so gpucheck's watch wraps its functions. A build takes tens of seconds: build one per
test module (a module- or session-scoped fixture)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType


def build(name: str, source: str, folder: Path) -> ModuleType:
    """Compile and load ``source`` as the extension module ``name``, in ``folder``, after the
    compiled-extension watch is installed (its functions are wrapped at load)."""
    from torch.utils import cpp_extension

    from gpucheck.detectors import ext_watch

    ext_watch.install()
    return cpp_extension.load_inline(
        name=name, cpp_sources=[source], build_directory=str(folder), verbose=False
    )
