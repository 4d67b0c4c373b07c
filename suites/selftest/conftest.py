"""Fixtures of the self-test's defect cases: the defect builds of gpucheck's own kernels
(``gpucheck._csrc.defects.DEFECTS``), the real extension for their clean twins, and the
sanitizer tool of the pass a case runs in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture(scope="session")
def defect_ops() -> Callable[[str], Any]:
    """``defect_ops(name)``: the ops (``torch.ops.gpucheck_defect_<name>``) of the defect build
    ``name``, JIT-built on first use from the package's csrc/ into gpucheck's build cache."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible")
    from gpucheck._csrc.defects import build_defect

    loaded: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in loaded:
            loaded[name] = getattr(torch.ops, build_defect(name))
        return loaded[name]

    return get


@pytest.fixture(scope="session")
def clean_ops() -> Any:
    """``torch.ops.gpucheck``: the real extension (clean twins of the defect cases)."""
    torch = pytest.importorskip("torch")
    from gpucheck._csrc import extension

    if not extension.available():
        pytest.skip("gpucheck's extension is not built")
    return torch.ops.gpucheck


@pytest.fixture
def sanitizer_defect_ops(
    defect_ops: Callable[[str], Any], request: pytest.FixtureRequest
) -> Callable[[str], Any]:
    """``defect_ops`` for defects only compute-sanitizer can see: the build is made (in the
    plain pass, so the sanitizer passes find it cached), then the case is skipped outside the
    sanitizer passes (the harness deselects it from the passes of tools it is not marked
    for)."""
    tool = request.config.getoption("--gpucheck-sanitizer-tool", None)

    def get(name: str) -> Any:
        ops = defect_ops(name)
        if tool is None:
            pytest.skip(
                "its defect is only visible to compute-sanitizer: it runs in the "
                "sanitizer pass of its tool"
            )
        return ops

    return get


@pytest.fixture(scope="session")
def zoo_builds() -> Callable[[str], Any]:
    """``zoo_builds(build)``: the module of a build of the zoo (a name of
    ``gpucheck._csrc.zoo.ZOO_BUILDS``), JIT-built on first use into gpucheck's build cache."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible")
    from gpucheck._csrc.zoo import build_zoo

    loaded: dict[str, Any] = {}

    def get(build: str) -> Any:
        if build not in loaded:
            loaded[build] = build_zoo(build)
        return loaded[build]

    return get


@pytest.fixture(scope="session")
def zoo_ext(
    zoo_builds: Callable[[str], Any], request: pytest.FixtureRequest
) -> Callable[[str], Any]:
    """``zoo_ext(build)``: :func:`zoo_builds` for the cases judged in the plain pass: their rows
    state what the per-call detectors and the wrong-device check must find."""
    if request.config.getoption("--gpucheck-sanitizer-tool", None):
        pytest.skip(
            "the zoo is judged in the plain pass (its rows expect the per-call detectors' findings)"
        )
    return zoo_builds


@pytest.fixture
def sanitizer_zoo_ext(
    zoo_builds: Callable[[str], Any], request: pytest.FixtureRequest
) -> Callable[[str], Any]:
    """:func:`zoo_builds` for the zoo's cases only compute-sanitizer judges: the build is made
    (in the plain pass, so the sanitizer passes find it cached), then the case is skipped
    outside the sanitizer passes of the tools it is marked for."""
    tool = request.config.getoption("--gpucheck-sanitizer-tool", None)

    def get(build: str) -> Any:
        ext = zoo_builds(build)
        if tool is None:
            pytest.skip("its row is judged by compute-sanitizer: it runs in the sanitizer passes")
        return ext

    return get


@pytest.fixture(scope="session")
def zoo_fn() -> Any:
    """zoo/zoo_functions.py (the zoo's autograd Functions and references), imported by its
    path whatever pytest's import mode."""
    import importlib.util
    from pathlib import Path

    pytest.importorskip("torch")
    path = Path(__file__).resolve().parent / "zoo" / "zoo_functions.py"
    spec = importlib.util.spec_from_file_location("gpucheck_selftest_zoo_functions", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
