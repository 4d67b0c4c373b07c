"""Which sources the extension build and the compile check take."""

from __future__ import annotations

import pytest

from gpucheck import _csrc


def test_sources_include_registration_and_every_kernel_folder():
    files = _csrc.sources()
    assert _csrc.CSRC / "registration.cpp" in files
    for kernel in _csrc.kernels():
        assert any(f.parent.name == kernel for f in files)


def test_kernel_subset_and_unknown_kernel(monkeypatch):
    monkeypatch.setenv(_csrc.KERNELS_ENV, "no_such_kernel")
    with pytest.raises(SystemExit, match="unknown kernels"):
        _csrc.kernels()
    monkeypatch.setenv(_csrc.KERNELS_ENV, "")
    every = _csrc.kernels()
    if every:
        monkeypatch.setenv(_csrc.KERNELS_ENV, every[0])
        assert _csrc.kernels() == [every[0]]


def test_static_libstdcxx_compiler_is_detected(tmp_path):
    """A compiler whose shared libraries carry their own libstdc++ is recognized."""
    import shutil

    if not (shutil.which("g++") and shutil.which("readelf")):
        pytest.skip("needs g++ and readelf")
    static = tmp_path / "static-g++"
    static.write_text('#!/bin/sh\nexec g++ -static-libstdc++ "$@"\n')
    static.chmod(0o755)
    assert _csrc.links_libstdcxx_dynamically("g++") is True
    assert _csrc.links_libstdcxx_dynamically(str(static)) is False
    assert _csrc.links_libstdcxx_dynamically(str(tmp_path / "missing")) is None
