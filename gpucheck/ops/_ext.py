"""Loading gpucheck's compiled extension (which registers ``torch.ops.gpucheck.*``)."""

from __future__ import annotations

import functools
from types import ModuleType

from gpucheck.errors import ExtensionNotBuilt

BUILD_HINT = (
    "on a machine with a CUDA toolkit and a CUDA build of torch, run "
    "`pip install --no-build-isolation -e .` in the gpucheck checkout "
    "(TORCH_CUDA_ARCH_LIST=9.0 for H100/H200)"
)


@functools.cache
def load() -> ModuleType:
    """Import ``gpucheck._C`` once; raise ExtensionNotBuilt with the fix if it is missing."""
    try:
        import torch  # noqa: F401  (the extension links against torch's libraries)

        from gpucheck import _C  # type: ignore[attr-defined]
    except ImportError as err:
        raise ExtensionNotBuilt(
            f"gpucheck's CUDA extension is not available ({err}); {BUILD_HINT}"
        ) from err
    return _C


def available() -> bool:
    """True when the compiled extension can be imported."""
    try:
        load()
    except ExtensionNotBuilt:
        return False
    return True
