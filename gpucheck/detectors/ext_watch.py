"""Every call of a compiled extension module's function, watched like a ``torch.ops`` call.

Most CUDA extensions in the field (3DGS rasterizers, fused SSIM, simple-knn) are not
``torch.ops``: they are a ``PYBIND11_MODULE`` built with ``torch.utils.cpp_extension``
(``CUDAExtension`` in setup.py, or ``load()``), called from a ``torch.autograd.Function``.
Their calls never reach the dispatcher, so :mod:`~gpucheck.detectors.op_watch` alone would
not see them. This module makes them reach the same listeners, under the name
``package._C.function``, so every per-call check (launch stream and device, output device,
device-state change, mixed-device arguments, fingerprints) works for them unchanged.

Design:

- **Which modules.** A *compiled torch extension* is a Python extension module (its
  ``__file__`` a shared library) whose ELF ``DT_NEEDED`` names ``libc10`` or ``libtorch*``
  (:mod:`gpucheck.detectors.elf` reads the file: no configuration). torch's own modules and
  the well-known libraries of :data:`KNOWN` are never watched. The ELF answer is cached per
  file.
- **What is wrapped.** Every function attribute of such a module (``builtin_function_or_
  method``: what pybind11's ``m.def`` and the C API make), and those of its pybind11
  submodules, is replaced in the module by a Python wrapper that calls
  :func:`op_watch.watched` when a listener is active and the function directly otherwise (one
  attribute read and one call). Classes and their methods are left alone.
- **When.** At import: the wrapping is done by :meth:`importlib.machinery.ExtensionFileLoader.
  exec_module`, patched once per process (:func:`install`: the pytest plugin does it before
  the first conftest is imported). Every way of loading an extension module goes through it:
  ``import pkg._C``, ``torch.utils.cpp_extension.load()`` / ``load_inline()`` (which never
  put the module into ``sys.modules``), ``importlib.util.spec_from_file_location``. Since the
  wrapper replaces the attribute before anyone reads it, ``from pkg._C import fn`` made after
  the import gets the wrapper too. A module imported before :func:`install` is wrapped by the
  rescan of ``sys.modules`` at the start of each case (:func:`scan`): calls that look the
  function up as ``_C.fn`` are then watched, a reference taken before (``from pkg._C import
  fn`` at the top of a module imported before gpucheck's plugin) is not.
- **The wrappers stay.** They are never restored: outside a case (no listener) they pass
  through, and a wrapper that some code still holds must keep working.
- **Opting out.** ``GPUCHECK_UNWATCHED=pkg._C,other._C.fn`` (every case) and the marker
  ``@pytest.mark.gpucheck_unwatched("pkg._C", "other._C.fn")`` (one case) name modules or
  functions whose calls are not watched (:func:`set_unwatched`, checked per call; a module
  name covers its functions). Kernels of an opted-out module's library are not judged as
  unclaimed either (:func:`libraries`).

The cost: per watched call the listeners' own work and a walk up the Python stack for the
caller's frame; outside cases one Python call per extension call.
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import sys
import threading
from dataclasses import dataclass
from types import BuiltinFunctionType, ModuleType
from typing import Any

from gpucheck.detectors import elf, op_watch
from gpucheck.detectors.base import disabled

#: top-level packages never watched: torch itself and libraries that ship with or beside it
KNOWN = (
    "torch",
    "torchvision",
    "torchaudio",
    "torchtext",
    "torchdata",
    "torchrec",
    "functorch",
    "fbgemm_gpu",
    "triton",
    "torch_tensorrt",
    "torchao",
)
#: comma-separated modules (``pkg._C``) or functions (``pkg._C.fn``) never watched
UNWATCHED_ENV = "GPUCHECK_UNWATCHED"
#: the marker that leaves modules or functions unwatched for one case
MARKER = "gpucheck_unwatched"


@dataclass
class Watched:
    """A compiled torch extension module whose functions are wrapped."""

    name: str
    path: str  # its shared library
    functions: list[str]  # "package._C.function"


_lock = threading.RLock()
_installed = False
_modules: dict[int, tuple[ModuleType, Watched]] = {}  # id -> (module, record): kept alive
_scanned = -1  # len(sys.modules) at the last scan
_skip: frozenset[str] = frozenset()


def _torch_dir() -> str | None:
    path = op_watch.torch_dir()
    return os.path.realpath(path) + os.sep if path else None


def is_torch_extension(module: Any) -> bool:
    """Whether ``module`` is a compiled torch extension that gpucheck watches: an extension
    module file linking libc10 / libtorch, not torch's own nor one of :data:`KNOWN`."""
    name = str(getattr(module, "__name__", ""))
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not elf.is_extension_file(path):
        return False
    if name.split(".")[0] in KNOWN:
        return False
    real = os.path.realpath(path)
    torch_dir = _torch_dir()
    if torch_dir and real.startswith(torch_dir):
        return False
    return elf.links_torch(real)


def _names(qualname: str) -> tuple[str, ...]:
    """``a.b.c`` -> ``("a", "a.b", "a.b.c")``: the names an opt-out may use."""
    parts = qualname.split(".")
    return tuple(".".join(parts[:i]) for i in range(1, len(parts) + 1))


def _wrap(qualname: str, fn: Any) -> Any:
    names = _names(qualname)

    @functools.wraps(fn)
    def watched(*args: Any, **kwargs: Any) -> Any:
        if not op_watch.watching() or (_skip and not _skip.isdisjoint(names)):
            return fn(*args, **kwargs)
        return op_watch.watched(qualname, fn, args, kwargs)

    setattr(watched, op_watch.ORIGINAL, fn)
    return watched


def _wrap_functions(module: ModuleType, prefix: str, depth: int = 0) -> list[str]:
    done = []
    for attr, value in list(vars(module).items()):
        if attr.startswith("__"):
            continue
        if isinstance(value, BuiltinFunctionType):
            qualname = f"{prefix}.{attr}"
            setattr(module, attr, _wrap(qualname, value))
            done.append(qualname)
        elif (
            isinstance(value, ModuleType)
            and depth < 3
            and getattr(value, "__file__", None) in (None, getattr(module, "__file__", None))
            and str(getattr(value, "__name__", "")).startswith(module.__name__ + ".")
        ):
            done += _wrap_functions(value, f"{prefix}.{attr}", depth + 1)  # a pybind submodule
    return done


def watch_module(module: ModuleType) -> Watched | None:
    """Wrap the functions of ``module`` if it is a compiled torch extension (once per module
    object); returns its record, or None."""
    with _lock:
        known = _modules.get(id(module))
        if known is not None and known[0] is module:
            return known[1]
        if not is_torch_extension(module):
            return None
        record = Watched(
            module.__name__,
            os.path.realpath(str(module.__file__)),
            _wrap_functions(module, module.__name__),
        )
        _modules[id(module)] = (module, record)
        return record


def _consider(module: Any) -> None:
    """The import hook's and the rescan's check: never raises (an import must not fail)."""
    if "torch" not in sys.modules:
        return  # a torch extension cannot be loaded before torch
    try:
        if isinstance(module, ModuleType):
            watch_module(module)
    except Exception:  # a module gpucheck cannot read is a module it leaves alone
        return


def scan() -> None:
    """Wrap every compiled torch extension in ``sys.modules`` not wrapped yet (modules
    imported before :func:`install`); skipped while ``sys.modules`` has not grown."""
    global _scanned
    count = len(sys.modules)
    if count == _scanned:
        return
    _scanned = count
    for module in list(sys.modules.values()):
        if elf.is_extension_file(getattr(module, "__file__", None)):
            _consider(module)


def install() -> None:
    """Watch compiled torch extensions from now on (once per process): the import hook, then
    a scan of what is already imported."""
    global _installed
    with _lock:
        if not _installed:
            loader = importlib.machinery.ExtensionFileLoader
            original = loader.exec_module

            def exec_module(self: Any, module: ModuleType, _original: Any = original) -> None:
                _original(self, module)
                _consider(module)

            exec_module.__wrapped__ = original  # type: ignore[attr-defined]
            loader.exec_module = exec_module  # type: ignore[method-assign]
            _installed = True
    scan()


def installed() -> bool:
    return _installed


def install_unless_disabled() -> None:
    """:func:`install`, unless ``$GPUCHECK_DISABLE_DETECTORS`` turns every detector off."""
    if "all" not in disabled():
        install()


def marker_names(markers: list[tuple[Any, ...]]) -> list[str]:
    """The names a test's ``gpucheck_unwatched`` markers give (one tuple of arguments per
    marker).

    Raises:
        ValueError: a marker names no module, or something that is not a name.
    """
    names: list[str] = []
    for args in markers:
        if not args or not all(isinstance(a, str) and a for a in args):
            raise ValueError(
                f"{MARKER}(...) takes the names of compiled extension modules or "
                f"functions ('pkg._C', 'pkg._C.fn'), got {args!r}"
            )
        names += args
    return names


def begin_test(names: list[str]) -> None:
    """A test starts: ``names`` (its markers') are left unwatched until :func:`set_unwatched`
    is called again (after its teardown), and extensions imported before :func:`install`
    are wrapped."""
    set_unwatched(names)
    if _installed:
        scan()


def parse_names(text: str | None) -> list[str]:
    """The names of a ``GPUCHECK_UNWATCHED`` value."""
    return [n.strip() for n in (text or "").split(",") if n.strip()]


def set_unwatched(names: tuple[str, ...] | list[str] = ()) -> frozenset[str]:
    """The modules and functions left unwatched from now on: ``names`` (a case's marker)
    and those of ``$GPUCHECK_UNWATCHED``."""
    global _skip
    _skip = frozenset((*names, *parse_names(os.environ.get(UNWATCHED_ENV))))
    return _skip


def unwatched(name: str) -> bool:
    """Whether the module or function ``name`` is left unwatched now."""
    return bool(_skip) and not _skip.isdisjoint(_names(name))


def watched_modules() -> list[Watched]:
    """The compiled torch extensions wrapped so far."""
    with _lock:
        return [record for _, record in _modules.values()]


def library_of(op: str) -> str | None:
    """The shared library of the compiled extension module whose function ``op``
    (``package._C.function``) is; None for any other op (a ``torch.ops`` op's library is not
    known here)."""
    with _lock:
        return next((r.path for _, r in _modules.values() if op in r.functions), None)


def libraries() -> dict[str, bool]:
    """The shared library of every compiled torch extension in this process -> whether it is
    watched now (False: its module is opted out). Besides the wrapped modules, every library
    mapped into the process that links libc10 / libtorch and is not torch's own or of
    :data:`KNOWN` (``torch.ops.load_library``, ``ctypes.CDLL``)."""
    found: dict[str, bool] = {}
    for record in watched_modules():
        found[record.path] = found.get(record.path, False) or not unwatched(record.name)
    torch_dir = _torch_dir()
    for path in _mapped_libraries():
        if path in found or (torch_dir and path.startswith(torch_dir)):
            continue
        parts = set(path.split(os.sep))
        if parts & set(KNOWN) or "nvidia" in parts:
            continue
        if elf.links_torch(path):
            found[path] = True
    return found


def _mapped_libraries() -> list[str]:
    """Shared libraries mapped into this process (Linux ``/proc/self/maps``; else none)."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    seen: dict[str, None] = {}
    for line in lines:
        parts = line.split(None, 5)
        path = parts[5].strip().removesuffix(" (deleted)") if len(parts) == 6 else ""
        if path.startswith("/") and ".so" in os.path.basename(path):
            seen.setdefault(os.path.realpath(path), None)
    return list(seen)


#: joins the libraries of a kernel that several libraries define
LIBRARY_SEP = ", "


def locate(kernels: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """The library of each kernel name (the profiler's) among the compiled torch extensions
    of this process (:func:`libraries`): its path, several joined by :data:`LIBRARY_SEP`
    where more than one defines that name, None where none does; and the libraries of the
    opted-out modules among them."""
    libs = libraries()
    out: dict[str, str | None] = {}
    for kernel in kernels:
        name = elf.name_path(kernel)
        found = [lib for lib in libs if elf.defines(lib, name)]
        out[kernel] = LIBRARY_SEP.join(found) if found else None
    every = {lib for value in out.values() if value for lib in value.split(LIBRARY_SEP)}
    return out, sorted(lib for lib in every if not libs[lib])
