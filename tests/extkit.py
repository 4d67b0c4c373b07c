"""Extension calls for the tests: small C++ torch extensions built on CPU
(``torch.utils.cpp_extension.load_inline``: a ``PYBIND11_MODULE`` that links libc10 /
libtorch the way a CUDA extension does, so gpucheck's watch wraps its functions; a build takes
tens of seconds: one per test session, from a module- or session-scoped fixture), the
loader a suite's test file uses for one, ``torch.library`` ops that leave outputs unwritten,
and a dispatch mode that lists what a case's own mode would see."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode


def build(name: str, source: str, tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """Compile and load ``source`` as the extension module ``name`` after the compiled-extension
    watch is installed (its functions are wrapped at load). Built once per test session: under
    pytest-xdist its workers share the build folder, the first to need the module builds it
    and the others wait for it, then load the same file (a module's tests may run on several
    workers, and each build takes tens of seconds of a core)."""
    from torch.utils import cpp_extension

    from gpucheck.detectors import ext_watch

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's, above each worker's own
    folder = root / "ext_builds" / name
    folder.mkdir(parents=True, exist_ok=True)
    ext_watch.install()
    with open(folder.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # let go when this process ends, however it ends
        # torch's own lock, left behind by a build whose process was killed, would hold
        # load_inline for ever; while we hold ours, no other build runs here
        (folder / "lock").unlink(missing_ok=True)
        return cpp_extension.load_inline(
            name=name, cpp_sources=[source], build_directory=str(folder), verbose=False
        )


#: what a suite's test file runs to load the extension built here (its name and file in
#: ``$EXT_NAME`` / ``$EXT_PATH``) the way ``cpp_extension.load()`` imports one (never in
#: ``sys.modules``): after gpucheck's plugin, so its functions are watched
SUITE_LOADER = """
import importlib.util, os, pytest, torch

def _ext():
    spec = importlib.util.spec_from_file_location(os.environ["EXT_NAME"], os.environ["EXT_PATH"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

@pytest.fixture(scope="module")
def ext():
    return _ext()  # loaded in a fixture, after the worker's watch was installed
"""


def run_suite(
    tmp_path: Path, name: str, text: str, ext: ModuleType, **env: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, Any]]]:
    """``gpucheck run --cpu-only`` on a suite of one test file (``text``, which loads ``ext``
    with :data:`SUITE_LOADER`), in ``tmp_path``: the process, and the case records by test
    name."""
    from clirun import gpucheck

    from gpucheck.model import results

    suite = tmp_path / "suites" / name
    suite.mkdir(parents=True)
    (suite / f"test_{name}.py").write_text(text)
    out = tmp_path / "out"
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--quiet",
        "--out",
        str(out),
        cwd=tmp_path,
        timeout=300,
        env={"EXT_NAME": ext.__name__, "EXT_PATH": str(ext.__file__), **env},
    )
    recs = {r["case"].rsplit("::", 1)[-1]: r for r in results.cases(out / "results.jsonl")}
    return proc, recs


# -- torch.library ops with outputs left unwritten (Python kernels: nothing to build) ------

LIB = torch.library.Library("gpucheck_tests", "DEF")
LIB.define("cull(Tensor means) -> (Tensor xy, Tensor radii)")
LIB.define("tail(Tensor x) -> Tensor out")


@torch.library.impl(LIB, "cull", "CPU")
def _cull(means: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 3DGS projection's convention: a culled point's (z <= 0) row of ``xy`` is never
    written, and its radius is 0."""
    xy = torch.empty(means.shape[0], 2)
    radii = torch.empty(means.shape[0], dtype=torch.int32)
    keep = means[:, 2] > 0
    xy[keep] = means[keep, :2]
    radii.copy_(torch.where(keep, 3, 0))
    return xy, radii


@torch.library.impl(LIB, "tail", "CPU")
def _tail(x: torch.Tensor) -> torch.Tensor:
    """A bug: the last five elements are never written, and nothing marks them."""
    out = torch.empty_like(x)
    out[:-5] = x[:-5] * 2
    return out


class Dispatched(TorchDispatchMode):
    """A case's own dispatch mode (a logging mode, ``opcheck``'s checks): lists what it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))
