"""One home per kernel: a bundled kernel is in four places, each named after it (csrc/<kernel>/
with its ops' schemas, gpucheck/kernels/<kernel>/ with its wrapper, oracle and planted defects,
suites/<kernel>/, benchmarks/<kernel>.py), the four agree, and ``gpucheck.ops``,
``gpucheck.reference`` and the defect builds are collected from the homes: a toy kernel added
the way docs/architecture.md says is found by all of them without editing anything else."""

from __future__ import annotations

import pkgutil
import re
import shutil
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpucheck.ops
import gpucheck.reference
from gpucheck import kernels
from gpucheck._csrc import defects
from gpucheck._csrc import sources as kernel_sources
from gpucheck.controller.suites import DECLARATION, read_declaration

ROOT = Path(__file__).resolve().parents[2]
#: the op names a kernel's sources declare in their schemas (``m.def("name(...``)
_SCHEMA = re.compile(r'm\.def\(\s*(?:static_cast<const char\*>\(\s*)?"(\w+)\(')
#: the ops a wrapper calls (``"gpucheck::name"``)
_CALLED = re.compile(r'"gpucheck::(\w+)"')


def places(root: Path) -> dict[str, set[str]]:
    """The kernels each place of the tree ``root`` holds: kernel folders of ``csrc/``, homes
    in ``gpucheck/kernels/``, suites that declare they need the kernels, benchmarks."""
    suites = root / "suites"
    return {
        "csrc": set(kernel_sources.kernels(root / "csrc")),
        "home": {
            m.name for m in pkgutil.iter_modules([str(root / "gpucheck" / "kernels")]) if m.ispkg
        },
        "suite": {
            p.parent.name
            for p in suites.glob(f"*/{DECLARATION}")
            if read_declaration(p).needs == "kernels"
        },
        "benchmark": {p.stem for p in (root / "benchmarks").glob("*.py")},
    }


def schemas(folder: Path) -> set[str]:
    """The ops whose schemas the sources of ``folder`` declare."""
    return {name for p in folder.glob("*.cpp") for name in _SCHEMA.findall(p.read_text())}


def assert_one_home_each(root: Path) -> set[str]:
    """Every kernel of ``root`` in the four places, its wrapper calling only ops its own
    sources declare; returns the kernels."""
    found = places(root)
    assert found["csrc"] == found["home"] == found["suite"], found
    assert found["csrc"] <= found["benchmark"], found
    for kernel in found["csrc"]:
        declared = schemas(root / "csrc" / kernel)
        called = set(_CALLED.findall((root / "gpucheck/kernels" / kernel / "op.py").read_text()))
        assert called and called <= declared, (kernel, called, declared)
    return found["csrc"]


@pytest.fixture(autouse=True)
def _all_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(kernel_sources.KERNELS_ENV, raising=False)


def test_each_bundled_kernel_has_its_four_places_and_declares_its_own_schemas() -> None:
    assert assert_one_home_each(ROOT) == {"knn", "splat", "ssim"}
    assert set(kernels.names()) == {"knn", "splat", "ssim"}
    # no schema outside a kernel's folder: registration.cpp only claims the library
    assert schemas(ROOT / "csrc") == set()
    declared = set().union(*(schemas(ROOT / "csrc" / k) for k in kernels.names()))
    assert {"ssim_forward", "knn_mean_sq_dist", "splat_project_backward"} <= declared


def test_the_facades_export_what_the_homes_export() -> None:
    assert gpucheck.ops.__all__ == ["knn_mean_sq_dist", "rasterize", "ssim"]
    assert gpucheck.reference.__all__ == [
        "RasterizeResult",
        "knn_mean_sq_dist",
        "rasterize",
        "ssim",
    ]
    from gpucheck.kernels.splat import op, reference

    assert gpucheck.ops.rasterize is op.rasterize
    assert gpucheck.reference.rasterize is reference.rasterize
    assert gpucheck.ops.rasterize is not gpucheck.reference.rasterize
    assert "ssim" in dir(gpucheck.ops)
    with pytest.raises(AttributeError, match="exports knn_mean_sq_dist, rasterize, ssim"):
        _ = gpucheck.ops.no_such_op
    with pytest.raises(AttributeError):
        _ = gpucheck.ops.__wrapped__  # a dunder is never searched for in the homes


def test_the_defect_builds_are_each_homes_defects_with_its_kernel() -> None:
    assert defects.planted() == defects.DEFECTS
    by_kernel = {
        k: {n for n, d in defects.DEFECTS.items() if d.kernel == k}
        for k in ["knn", "ssim", "splat"]
    }
    assert by_kernel["splat"] == {"buffers_current_device"}
    assert {"legacy_stream", "no_guard_ssim", "shared_oob", "no_sync"} == by_kernel["ssim"]
    assert len(defects.DEFECTS) == 10


# --- a toy kernel, added the documented way ------------------------------------------------

TOY = {
    "csrc/toy/toy.cpp": """\
        // Entry point of the toy kernel: guard, checks, launch; its schema and registration.
        #include <ATen/core/Tensor.h>
        #include <torch/library.h>

        #include "common.h"
        #include "library.h"

        namespace gpucheck::toy {
        at::Tensor toy_scale_cuda(const at::Tensor& x, double factor) {  // [N]
          GPUCHECK_DEVICE_GUARD(x);
          check_cuda(x, "toy_scale", "x");
        #ifdef GPUCHECK_DEFECT_TOY_COPY
          return x;  // defect: returns its input instead of a new tensor
        #else
          return x * factor;
        #endif
        }

        GPUCHECK_TORCH_LIBRARY_FRAGMENT(m) {
          m.def("toy_scale(Tensor x, float factor) -> Tensor");
        }

        GPUCHECK_TORCH_LIBRARY_IMPL(CUDA, m) {
          m.impl("toy_scale", &toy_scale_cuda);
        }
        }  // namespace gpucheck::toy
        """,
    "gpucheck/kernels/toy/__init__.py": '"""A toy kernel: x times a factor."""\n',
    "gpucheck/kernels/toy/op.py": """\
        \"\"\"The toy kernel on CUDA.\"\"\"

        from gpucheck._csrc.extension import registered_op

        __all__ = ["toy_scale"]


        def toy_scale(x, factor):
            return registered_op("gpucheck::toy_scale", lambda x, f: x.new_empty(x.shape))(
                x, factor
            )
        """,
    "gpucheck/kernels/toy/reference.py": """\
        \"\"\"The toy kernel's oracle.\"\"\"

        __all__ = ["toy_scale"]


        def toy_scale(x, factor):
            return x * factor
        """,
    "gpucheck/kernels/toy/defects.py": 'DEFECTS = {"toy_copy": "GPUCHECK_DEFECT_TOY_COPY"}\n',
    "suites/toy/suite.toml": """\
        needs = "kernels"
        probe = "gpucheck._csrc.extension:problem_in_child"
        """,
    "suites/toy/test_toy.py": "def test_toy_scale(gpu_device):\n    pass\n",
    "benchmarks/toy.py": '"""Timing of the toy kernel."""\n',
}


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A tree holding the toy kernel in its four places (and csrc/'s shared headers), its
    home on gpucheck.kernels' path; afterwards gone from the facades and sys.modules."""
    for name in ("registration.cpp", "library.h", "common.h"):
        (tmp_path / "csrc").mkdir(exist_ok=True)
        shutil.copy2(ROOT / "csrc" / name, tmp_path / "csrc" / name)
    for rel, text in TOY.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    monkeypatch.setattr(
        kernels, "__path__", [*kernels.__path__, str(tmp_path / "gpucheck/kernels")]
    )
    yield tmp_path
    for facade in (gpucheck.ops, gpucheck.reference):
        vars(facade).pop("toy_scale", None)
    for module in [m for m in sys.modules if m.startswith("gpucheck.kernels.toy")]:
        del sys.modules[module]


def test_a_toy_kernel_added_the_documented_way_is_found_by_every_place(toy: Path) -> None:
    assert assert_one_home_each(toy) == {"toy"}
    assert kernel_sources.sources(toy / "csrc") == [
        toy / "csrc/registration.cpp",
        toy / "csrc/toy/toy.cpp",
    ]
    assert kernels.names() == ["knn", "splat", "ssim", "toy"]
    assert "toy_scale" in gpucheck.ops.__all__ and "toy_scale" in gpucheck.reference.__all__
    from gpucheck.kernels.toy import op

    assert gpucheck.ops.toy_scale is op.toy_scale
    assert gpucheck.reference.toy_scale(3, 2) == 6
    planted = defects.planted()
    assert planted["toy_copy"] == defects.DefectBuild("GPUCHECK_DEFECT_TOY_COPY", "toy")
    assert {k: v for k, v in planted.items() if k != "toy_copy"} == defects.DEFECTS


def test_two_homes_exporting_one_name_are_refused(toy: Path) -> None:
    (toy / "gpucheck/kernels/toy/op.py").write_text('__all__ = ["ssim"]\nssim = None\n')
    with pytest.raises(
        ValueError, match=r"gpucheck.kernels.ssim.op and gpucheck.kernels.toy.op both export 'ssim'"
    ):
        kernels.exports("op")
