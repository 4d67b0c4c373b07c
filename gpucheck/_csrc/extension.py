"""Loading gpucheck's CUDA kernels, which register ``torch.ops.gpucheck.*``.

Where the kernels were built at install (``gpucheck._C``) that build is used; otherwise the
package's own sources (``gpucheck.csrc``) are built once, on first use, with ninja into
gpucheck's cache (``torch.utils.cpp_extension.load``), the way gsplat ships its kernels. One
line on stderr says so while it builds, and every way this can fail (no torch, a CPU-only
torch, no CUDA toolkit, no ninja, a compile error) ends in one :class:`ExtensionNotBuilt`
sentence. A build already in the cache loads without nvcc or ninja: only a build needs them.
Several processes may load at once (pytest -n, one worker per GPU): a file lock lets one
build while the others wait, and a lock the OS releases dies with a killed build.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.machinery import ExtensionFileLoader
from pathlib import Path
from types import ModuleType
from typing import Any

import gpucheck
from gpucheck._csrc import sources as kernel_sources
from gpucheck._csrc import toolchain
from gpucheck.errors import ExtensionNotBuilt

NOT_AVAILABLE = "gpucheck's CUDA extension is not available"
BUILD_HINT = (
    "see docs/install.md (in a checkout, `pip install --no-build-isolation -e .` "
    "builds them at install)"
)
#: the library of a build: registration.cpp defines ``PyInit__C``
LIBRARY = "_C"
#: the sources whose change makes a cached build stale
_INPUTS = (".h", ".cuh", ".cpp", ".cu")
#: how long :func:`problem_in_child` lets a first-use build take
CHILD_TIMEOUT_S = 3600.0


def _unavailable(why: str, hint: bool = True) -> ExtensionNotBuilt:
    return ExtensionNotBuilt(f"{NOT_AVAILABLE}: {why}" + (f"; {BUILD_HINT}" if hint else ""))


@functools.cache
def _attempt() -> ModuleType | ExtensionNotBuilt:
    """Load (or build) once per process; a failure is remembered too (a failed build is not
    tried again by every later call)."""
    try:
        import torch
    except ImportError as err:
        return _unavailable(f"torch is not importable ({err})")
    try:
        from gpucheck import _C  # type: ignore[attr-defined]
    except ImportError:  # not built at install, or built against another torch
        pass
    else:
        return _C
    try:
        return _jit(torch)
    except ExtensionNotBuilt as err:
        return err


def load() -> ModuleType:
    """The kernels' module: ``gpucheck._C`` when it was built at install, else the build of
    the package's sources in gpucheck's cache, made first where there is none yet or the
    sources changed since.

    Raises:
        gpucheck.errors.ExtensionNotBuilt: why the kernels cannot be had, in one sentence
            (where a compile failed: where its output is).
    """
    got = _attempt()
    if isinstance(got, ExtensionNotBuilt):
        raise ExtensionNotBuilt(str(got))
    return got


def available() -> bool:
    """True when the kernels can be loaded (building them first where needed)."""
    try:
        load()
    except ExtensionNotBuilt:
        return False
    return True


def _jit(torch: Any) -> ModuleType:
    """The cached build of the package's sources for this torch, made first if needed."""
    if torch.version.cuda is None:
        raise _unavailable(
            f"torch {torch.__version__} is a CPU-only build, and the kernels "
            "need a CUDA build of torch"
        )
    cuda_home = toolchain.cuda_home()  # None: no toolkit, which only a build needs
    archs, label = _archs(torch, cuda_home)
    try:
        sources = kernel_sources.sources()
    except SystemExit as err:  # GPUCHECK_KERNELS names a kernel that does not exist
        raise _unavailable(str(err), hint=False) from None
    if not sources:
        raise _unavailable(
            f"the package's CUDA sources are missing ({kernel_sources.csrc_dir()})", hint=False
        )
    csrc = kernel_sources.csrc_dir()
    key = repr(
        (
            gpucheck.__version__,
            toolchain.CXX_FLAGS,
            toolchain.NVCC_FLAGS,
            archs,
            os.environ.get("TORCH_CUDA_ARCH_LIST"),
            [s.relative_to(csrc).as_posix() for s in sources],
        )
    )
    tag = "-".join(label.replace(" (+PTX)", "+PTX").split(", "))
    name = f"kernels-{tag}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    folder = toolchain.build_dir(name, make=False)
    library = folder / f"{LIBRARY}.so"
    inputs = [p for p in csrc.rglob("*") if p.suffix in _INPUTS]
    if folder.is_dir():
        with _locked(folder / "gpucheck.lock", exclusive=False):
            if _up_to_date(library, inputs):
                return _import(library, folder)
    cuda_home = _build_tools(torch, cuda_home)  # a build is needed from here on
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _unavailable(
            f"its build folder cannot be made in {toolchain.cache_dir()} "
            f"({err.strerror or err}); set {toolchain.CACHE_ENV} to a writable "
            "folder",
            hint=False,
        ) from err
    with _locked(folder / "gpucheck.lock", exclusive=True):  # one process builds, others wait
        if not _up_to_date(library, inputs):
            print(
                f"gpucheck: building the CUDA kernels for {label} (first use; about a "
                f"minute) in {folder}",
                file=sys.stderr,
                flush=True,
            )
            _build(sources, archs, folder, cuda_home, label)
        return _import(library, folder)


def _build_tools(torch: Any, cuda_home: Path | None) -> Path:
    """The toolkit of a build, once nvcc and ninja are known to be there: else why not, in
    one sentence (a cached build needs neither)."""
    if cuda_home is None:
        raise _unavailable(
            "they are built on first use, but no CUDA toolkit was found (no nvcc in "
            f"$CUDA_HOME, on PATH or in /usr/local/cuda): install the toolkit of torch's CUDA "
            f"{torch.version.cuda}, or set CUDA_HOME to it"
        )
    if shutil.which("ninja") is None:  # torch's build runs `ninja` from PATH
        raise _unavailable(
            "they are built on first use with ninja, which is not on PATH: `pip install "
            "ninja` in this environment (activate it, or put its bin/ on PATH)"
        )
    return cuda_home


def _archs(torch: Any, cuda_home: Path | None) -> tuple[list[str] | None, str]:
    """The architectures to build for (None: TORCH_CUDA_ARCH_LIST's names, e.g. ``Hopper``,
    which torch reads) and how to name them."""
    wanted = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if wanted:
        archs = toolchain.parse_arch_env(wanted)
        return archs, toolchain.arch_label(archs) if archs else f"TORCH_CUDA_ARCH_LIST={wanted}"
    visible = (
        [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    archs = toolchain.arch_list(visible, toolchain.nvcc_archs(cuda_home) if cuda_home else None)
    return archs, toolchain.arch_label(archs)


@contextlib.contextmanager
def _locked(path: Path, exclusive: bool) -> Iterator[None]:
    """flock on ``path``: the OS releases it when its process ends, even a killed one, so a
    build interrupted half-way leaves no lock that would make every later run wait."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _up_to_date(library: Path, inputs: list[Path]) -> bool:
    if not library.is_file():
        return False
    built = library.stat().st_mtime
    return all(p.stat().st_mtime <= built for p in inputs)


def _build(
    sources: list[Path], archs: list[str] | None, folder: Path, cuda_home: Path, label: str
) -> None:
    """Compile and link the kernels into ``folder`` (our lock held); a failure leaves its
    output in ``folder/build.log`` and raises the sentence that points there."""
    import warnings

    from torch.utils import cpp_extension

    (folder / "lock").unlink(missing_ok=True)  # torch's own lock: one here is a killed build's
    log = folder / "build.log"
    try:
        toolchain.torch_build_env()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. torch's notes on compiler versions
            cpp_extension.load(
                name=LIBRARY,
                sources=[str(s) for s in sources],
                extra_include_paths=[str(kernel_sources.csrc_dir())],
                extra_cflags=toolchain.CXX_FLAGS,
                extra_cuda_cflags=[*toolchain.NVCC_FLAGS, *toolchain.gencode_flags(archs or [])],
                build_directory=str(folder),
                is_python_module=False,
                verbose=False,
            )
    except Exception as err:  # the compiler's, ninja's or torch's checks alike
        text = str(err)
        log.write_text(text + "\n")
        raise _unavailable(
            f"building it for {label} with {cuda_home / 'bin' / 'nvcc'} failed "
            f"({first_error(text) or repr(err)}); the compiler's output is in "
            f"{log}",
            hint=False,
        ) from err
    log.write_text("built\n")


def first_error(output: str) -> str:
    """The first compiler diagnostic of a build's output (``error: ...``), else its first
    line; at most 200 characters."""
    found = re.search(r"\b(?:fatal )?error\b\s*:.*", output, re.IGNORECASE)
    line = found.group(0) if found else next(iter(output.strip().splitlines()), "")
    return line.strip()[:200]


def _import(library: Path, folder: Path) -> ModuleType:
    """Import a build as ``gpucheck._C`` (loading it registers the ops)."""
    name = "gpucheck._C"
    try:
        spec = importlib.util.spec_from_file_location(
            name, library, loader=ExtensionFileLoader(name, str(library))
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError) as err:
        raise _unavailable(
            f"loading the kernels built in {folder} failed ({err}); delete that "
            "folder to build them again",
            hint=False,
        ) from err
    return module


def child_main() -> int:
    """The child of :func:`problem_in_child`: load the kernels (building them if needed);
    print why not on one line and return 3 when they cannot be loaded."""
    import warnings

    warnings.simplefilter("ignore")  # the parent shows this process's stderr: our lines only
    try:
        module = load()
    except Exception as err:  # ExtensionNotBuilt, and anything unforeseen, as one line
        lines = str(err).strip().splitlines()
        print(lines[0] if lines else repr(err))
        return 3
    print(f"{LOADED}{getattr(module, '__file__', '')}")
    return 0


#: what :func:`child_main` prints before the path of the module it loaded
LOADED = "loaded: "
#: where the last successful check is kept (in gpucheck's build cache)
CHECKED_FILE = "load-check.json"


def _check_key() -> dict[str, Any]:
    """What decides whether the kernels load, known without importing torch: this Python,
    the installed torch, the kernels asked for and the sources (a change rebuilds them)."""
    import importlib.metadata

    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    files = []
    for path in kernel_sources.sources():
        st = path.stat()
        files.append([str(path), st.st_mtime_ns, st.st_size])
    return {
        "python": sys.executable,
        "torch": torch_version,
        "kernels": os.environ.get("GPUCHECK_KERNELS"),
        "cache": os.environ.get(toolchain.CACHE_ENV),
        "sources": files,
    }


def _file_id(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def _checked_before(key: dict[str, Any]) -> bool:
    """Whether an earlier check loaded the kernels with the same key from a module file that
    is still the same file: then loading them again in a child would tell nothing new."""
    try:
        said = json.loads((toolchain.cache_dir() / CHECKED_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(said, dict)
        and said.get("key") == key
        and bool(said.get("module"))
        and said.get("file") == _file_id(str(said["module"]))
    )


def _remember(key: dict[str, Any], module: str) -> None:
    with contextlib.suppress(OSError):
        folder = toolchain.cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{CHECKED_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps({"key": key, "module": module, "file": _file_id(module)}))
        os.replace(tmp, folder / CHECKED_FILE)


def problem_in_child(timeout: float = CHILD_TIMEOUT_S) -> str | None:
    """Why the kernels cannot be loaded, or None when they can: checked in a child process,
    which builds them first where this is their first use (its progress line goes to this
    process's stderr). The caller never imports torch, and a broken build cannot take it
    down. A check that loaded them is remembered (:data:`CHECKED_FILE`): while this Python,
    torch, the sources and the module file stay the same, the next run skips the child (it
    costs a torch import and a load, seconds before any worker starts)."""
    key = _check_key()
    if _checked_before(key):
        return None
    code = "import sys; from gpucheck._csrc import extension; sys.exit(extension.child_main())"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return (
            f"building gpucheck's CUDA kernels did not finish within {timeout:.0f} s "
            f"(a build's files are in {toolchain.cache_dir()})"
        )
    said = proc.stdout.strip().splitlines()
    if proc.returncode == 0:
        loaded = [x[len(LOADED) :] for x in said if x.startswith(LOADED)]
        if loaded and loaded[-1]:
            _remember(key, loaded[-1])
        return None
    return (
        said[-1]
        if said
        else (f"loading gpucheck's CUDA extension failed (exit code {proc.returncode})")
    )


def registered_op(qualname: str, fake: Callable[..., Any]) -> Any:
    """The default overload of op ``ns::name`` of the extension, with its fake (meta)
    implementation registered (callers cache it: registration happens once).

    Raises:
        gpucheck.errors.ExtensionNotBuilt: the kernels cannot be loaded, or their build does
            not hold the op (its kernel was left out: GPUCHECK_KERNELS).
    """
    import torch

    load()
    namespace, name = qualname.split("::")
    library = getattr(torch.ops, namespace)
    if not hasattr(library, name):  # the op's schema was not registered: no such op here
        wanted = os.environ.get(kernel_sources.KERNELS_ENV)
        if wanted:
            raise _unavailable(
                f"its build holds no op {qualname}: {kernel_sources.KERNELS_ENV}={wanted} "
                "leaves its kernel out",
                hint=False,
            )
        raise _unavailable(
            f"its build holds no op {qualname} (built with {kernel_sources.KERNELS_ENV} "
            "naming other kernels): build it again"
        )
    torch.library.register_fake(qualname)(fake)
    return getattr(library, name).default
