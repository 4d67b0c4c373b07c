"""Which sources the extension build and the compile check take."""

from __future__ import annotations

import pytest

from gpucheck._csrc import compile_check, defects, pybind, toolchain
from gpucheck._csrc import sources as kernel_sources


def test_sources_include_registration_and_every_kernel_folder():
    files = kernel_sources.sources()
    assert kernel_sources.csrc_dir() / "registration.cpp" in files
    for kernel in kernel_sources.kernels():
        assert any(f.parent.name == kernel for f in files)


def test_kernel_subset_and_unknown_kernel(monkeypatch):
    monkeypatch.setenv(kernel_sources.KERNELS_ENV, "no_such_kernel")
    with pytest.raises(SystemExit, match="unknown kernels"):
        kernel_sources.kernels()
    monkeypatch.setenv(kernel_sources.KERNELS_ENV, "")
    every = kernel_sources.kernels()
    if every:
        monkeypatch.setenv(kernel_sources.KERNELS_ENV, every[0])
        assert kernel_sources.kernels() == [every[0]]


def test_static_libstdcxx_compiler_is_detected(tmp_path):
    """A compiler whose shared libraries carry their own libstdc++ is recognized."""
    import shutil

    if not (shutil.which("g++") and shutil.which("readelf")):
        pytest.skip("needs g++ and readelf")
    static = tmp_path / "static-g++"
    static.write_text('#!/bin/sh\nexec g++ -static-libstdc++ "$@"\n')
    static.chmod(0o755)
    assert toolchain.links_libstdcxx_dynamically("g++") is True
    assert toolchain.links_libstdcxx_dynamically(str(static)) is False
    assert toolchain.links_libstdcxx_dynamically(str(tmp_path / "missing")) is None


def test_every_defect_build_has_its_own_op_namespace():
    libs = [defects.defect_library(name) for name in defects.DEFECTS]
    assert len(set(libs)) == len(libs)
    assert all(lib.startswith("gpucheck_defect_") for lib in libs)
    assert defects.defect_library("no_guard_knn") == "gpucheck_defect_no_guard_knn"
    # one macro, two kernels: two builds
    guard = {
        n: d.kernel for n, d in defects.DEFECTS.items() if d.macro == "GPUCHECK_DEFECT_NO_GUARD"
    }
    assert guard == {"no_guard_ssim": "ssim", "no_guard_knn": "knn"}


def test_a_defect_is_named_by_its_name_or_by_a_macro_of_one_build():
    # what suites/selftest/test_defect_stream.py and the recorded profiler traces use
    assert defects.defect_library("GPUCHECK_DEFECT_LEGACY_STREAM") == (
        "gpucheck_defect_legacy_stream"
    )
    assert defects.defect_flags("legacy_stream") == [
        "-DGPUCHECK_DEFECT_LEGACY_STREAM",
        "-DGPUCHECK_LIBRARY=gpucheck_defect_legacy_stream",
    ]
    with pytest.raises(KeyError, match="several kernels"):
        defects.defect_name("GPUCHECK_DEFECT_NO_GUARD")
    with pytest.raises(KeyError, match="unknown defect"):
        defects.defect_name("GPUCHECK_DEFECT_NOTHING")


def test_a_defect_build_takes_the_schemas_and_its_kernel_folder():
    files = defects.defect_sources("uninit_read")
    assert kernel_sources.csrc_dir() / "registration.cpp" in files
    assert {f.parent.name for f in files} == {"csrc", "knn"}


@pytest.mark.parametrize(
    ("name", "changed"),
    [
        ("no_guard_knn", ["knn/knn.cpp"]),  # through common.h
        ("set_device", ["knn/knn.cpp"]),  # through common.h
        ("output_current_device", ["knn/knn.cpp"]),
        ("nondeterminism", ["knn/knn.cpp"]),
        ("uninit_read", ["knn/knn_cuda.cu"]),
        ("no_guard_ssim", ["ssim/ssim.cpp"]),
        ("legacy_stream", ["ssim/ssim.cpp"]),
        ("buffers_current_device", ["splat/splat.cpp"]),
    ],
)
def test_the_compile_check_compiles_again_what_a_defect_macro_changes(name, changed):
    assert [
        f.relative_to(kernel_sources.csrc_dir()).as_posix() for f in defects.defect_units(name)
    ] == changed
    units, _ = compile_check.check_units("only")
    mine = [
        (f.relative_to(kernel_sources.csrc_dir()).as_posix(), flags)
        for f, flags, label in units
        if label == f" [{name}]"
    ]
    assert mine == [(c, defects.defect_flags(name)) for c in changed]
    every, _ = compile_check.check_units("skip")
    assert all(not flags for _, flags, _ in every) and len(every) == len(
        kernel_sources.sources() + compile_check.check_only_sources()
    )


def test_every_registration_goes_through_the_namespace_macros():
    """A defect build loads next to the real extension in one process (the self-test's clean
    twins): a source registering with a literal ``gpucheck`` namespace would, in the defect
    build, put the defect's kernels over the real ones (and leave the defect's namespace
    without any). Every TORCH_LIBRARY / TORCH_LIBRARY_FRAGMENT / TORCH_LIBRARY_IMPL in csrc/
    goes through library.h's GPUCHECK_ macros; each kernel declares its schemas in a fragment."""
    import re

    raw = re.compile(r"^\s*TORCH_LIBRARY(_IMPL|_FRAGMENT)?\s*\(", re.M)
    offenders = []
    csrc = kernel_sources.csrc_dir()
    for path in sorted(csrc.rglob("*")):
        if path.suffix in (".cpp", ".cu", ".h", ".cuh") and path.name != "library.h":
            text = path.read_text()
            offenders += [
                f"{path.relative_to(csrc)}:{text[: m.start()].count(chr(10)) + 1}"
                for m in raw.finditer(text)
            ]
    assert offenders == [], f"register through GPUCHECK_TORCH_LIBRARY(_FRAGMENT|_IMPL): {offenders}"
    for macro in ("GPUCHECK_TORCH_LIBRARY_IMPL(", "GPUCHECK_TORCH_LIBRARY_FRAGMENT("):
        found = [p.name for p in csrc.rglob("*.cpp") if macro in p.read_text()]
        assert {"ssim.cpp", "knn.cpp", "splat.cpp", "splat_project_backward.cpp"} <= set(found)


def test_the_pybind_extension_is_compile_checked_clean_and_with_each_defect():
    names = {f.name for f in compile_check.check_only_sources()}
    assert {"pybind_defects.cpp", "pybind_defects.cu"} <= names
    units, missing = compile_check.check_units("only")
    variants = {(f.name, tuple(flags)) for f, flags, label in units if "pybind" in label}
    assert variants == {
        ("pybind_defects.cu", ("-DGPUCHECK_PYBIND_DEFECT_LEGACY_STREAM",)),
        ("pybind_defects.cu", ("-DGPUCHECK_PYBIND_DEFECT_CUB_STREAM0",)),
        ("pybind_defects.cpp", ("-DGPUCHECK_PYBIND_DEFECT_OUTPUT_CURRENT_DEVICE",)),
        ("pybind_defects.cpp", ("-DGPUCHECK_PYBIND_DEFECT_SET_DEVICE",)),
    }
    assert not [m for m in missing if "pybind" in m]
    sources = {f.name: f.read_text() for f in pybind.pybind_sources()}
    for name, flags in variants:  # every macro is one the source tests
        assert f"#ifdef {flags[0].removeprefix('-D')}" in sources[name]
    assert pybind.pybind_module_name("clean") == "gpucheck_pybind_clean"
    assert pybind.pybind_flags("clean") == []
    with pytest.raises(KeyError, match="unknown pybind build"):
        pybind.pybind_module_name("nothing")
