"""gpucheck's bundled kernels, one home each (gsplat's ``cuda/`` is the model: a kernel's
wrapper and its torch twin side by side, so that one kernel is one place to read).

``gpucheck/kernels/<kernel>/`` holds, under the name of its CUDA sources' folder
``csrc/<kernel>/`` (which declares its ops' schemas too):

- ``op.py``: the typed wrapper of its ``torch.ops.gpucheck.*`` ops (the input checks the C++
  entry point cannot make as well, fake implementations, autograd), loading the extension on
  first call (:mod:`gpucheck._csrc.extension`);
- ``reference.py``: its pure-PyTorch oracle (float64, CPU or GPU), which holds the constants
  and rules the wrapper shares with it;
- ``defects.py`` (where it has any): its planted defects, ``DEFECTS``: the name of each defect
  build -> the ``GPUCHECK_DEFECT_*`` macro its sources test (csrc/README.md), collected by
  :mod:`gpucheck._csrc.defects`.

:mod:`gpucheck.ops` and :mod:`gpucheck.reference` export the names of every home's ``op`` and
``reference`` modules (their ``__all__``), found here: a new kernel edits neither. Besides its
home and ``csrc/<kernel>/``, a kernel has its GPU suite in ``suites/<kernel>/`` and its timing in
``benchmarks/<kernel>.py`` (docs/architecture.md, "Where a new piece goes").

This package imports neither torch nor a home at import time; a home's ``__init__`` and its
``defects`` module import nothing that needs torch either.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from types import ModuleType
from typing import Any

#: the modules of a home: its wrapper, its oracle, its planted defects
PARTS = ("op", "reference", "defects")


def names() -> list[str]:
    """The kernels that have a home: the packages of this one, sorted."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)


def part(kernel: str, name: str) -> ModuleType | None:
    """The module ``name`` (one of :data:`PARTS`) of ``kernel``'s home, imported; None where
    the home has none."""
    if name not in PARTS:
        raise ValueError(f"a kernel's home has no part {name!r}; its parts: {', '.join(PARTS)}")
    module = f"{__name__}.{kernel}.{name}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module:  # the part is there, but something it imports is not
            raise
        return None


def exports(name: str) -> dict[str, str]:
    """What the homes' ``name`` modules export (their ``__all__``): each name -> its kernel.
    Imports those modules (and torch with them).

    Raises:
        ValueError: two homes export one name (a facade could not tell which is meant).
    """
    found: dict[str, str] = {}
    for kernel in names():
        module = part(kernel, name)
        for public in getattr(module, "__all__", ()):
            if public in found:
                raise ValueError(
                    f"gpucheck.kernels.{found[public]}.{name} and gpucheck.kernels.{kernel}."
                    f"{name} both export {public!r}"
                )
            found[public] = kernel
    return found


def exported(facade: str, name: str, attribute: str) -> Any:
    """``attribute`` of the facade module ``facade`` (:mod:`gpucheck.ops`: ``name`` is ``"op"``;
    :mod:`gpucheck.reference`: ``"reference"``): a name some home's ``name`` module exports,
    or ``__all__``, all of them.

    Raises:
        AttributeError: no home exports ``attribute``.
    """
    if attribute.startswith("__") and attribute != "__all__":
        raise AttributeError(f"module {facade!r} has no attribute {attribute!r}")
    table = exports(name)
    if attribute == "__all__":
        return sorted(table)
    kernel = table.get(attribute)
    if kernel is None:
        raise AttributeError(
            f"module {facade!r} has no attribute {attribute!r} (it exports "
            f"{', '.join(sorted(table))}: the __all__ of gpucheck/kernels/*/{name}.py)"
        )
    return getattr(part(kernel, name), attribute)


def facade_attribute(module: str, name: str, attribute: str) -> Any:
    """The module ``__getattr__`` of a facade (``module``, its ``__name__``) that exports what
    the homes' ``name`` modules export (:func:`exported`): a name found once is kept in the
    facade, so that later lookups do not search the homes again (``__all__`` is not: it is
    read anew from the homes)."""
    value = exported(module, name, attribute)
    if attribute != "__all__":
        setattr(sys.modules[module], attribute, value)
    return value


def facade_names(module: str, name: str) -> list[str]:
    """The module ``__dir__`` of such a facade."""
    return sorted({*vars(sys.modules[module]), *exports(name)})
