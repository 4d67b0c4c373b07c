"""Extension calls for the tests: small C++ torch extensions built on CPU
(``torch.utils.cpp_extension.load_inline``: a ``PYBIND11_MODULE`` that links libc10 /
libtorch the way a CUDA extension does, so gpucheck's watch wraps its functions; a build takes
tens of seconds: build one per test module, in a module- or session-scoped fixture), the
loader a suite's test file uses for one, ``torch.library`` ops that leave outputs unwritten,
and a dispatch mode that lists what a case's own mode would see."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def build(name: str, source: str, folder: Path) -> ModuleType:
    """Compile and load ``source`` as the extension module ``name``, in ``folder``, after the
    compiled-extension watch is installed (its functions are wrapped at load)."""
    from torch.utils import cpp_extension

    from gpucheck.detectors import ext_watch

    ext_watch.install()
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
