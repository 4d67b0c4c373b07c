"""Loading gpucheck's compiled extension (which registers ``torch.ops.gpucheck.*``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

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


def registered_op(qualname: str, fake: Callable[..., Any]) -> Any:
    """The default overload of op ``ns::name`` of the extension, with its fake (meta)
    implementation registered (callers cache it: registration happens once).

    Raises:
        gpucheck.errors.ExtensionNotBuilt: the compiled extension is not installed.
    """
    import torch

    load()
    torch.library.register_fake(qualname)(fake)
    namespace, name = qualname.split("::")
    return getattr(getattr(torch.ops, namespace), name).default
