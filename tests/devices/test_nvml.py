"""gpucheck.nvml: the NA sentinel, the query helper, and init failures in words."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pynvml
import pytest

from gpucheck import nvml


@pytest.fixture(autouse=True)
def fresh_nvml():
    nvml.reset()
    yield
    nvml.reset()


def test_na_is_a_falsy_singleton_that_serializes_as_null():
    assert nvml.NA is type(nvml.NA)()
    assert not nvml.NA
    assert repr(nvml.NA) == "N/A"
    assert json.dumps([nvml.na_to_none(nvml.NA), nvml.na_to_none(0)]) == "[null, 0]"


def _fake_init_ok(monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)


@pytest.mark.parametrize(
    ("code", "words", "no_driver"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver is installed", True),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded", True),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "version mismatch", False),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission", False),
    ],
)
def test_init_failures_become_one_sentence(monkeypatch, code, words, no_driver):
    def boom():
        raise pynvml.NVMLError(code)

    monkeypatch.setattr(pynvml, "nvmlInit", boom)
    st = nvml.status()
    assert not st.ok
    assert words in st.reason
    assert st.no_driver is no_driver
    # every query degrades to NA instead of raising
    assert nvml.query("nvmlDeviceGetCount") is nvml.NA
    assert nvml.device_count() == 0


def test_missing_library_on_this_machine_is_reported_not_raised():
    # CI machines have no NVIDIA driver: the real pynvml must fail to load libnvidia-ml.
    st = nvml.status()
    if st.ok:
        pytest.skip("this machine has an NVIDIA driver")
    assert st.no_driver
    assert "libnvidia-ml" in st.reason


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_GPU_IS_LOST,
    ],
)
def test_query_turns_nvml_errors_into_default(monkeypatch, code):
    _fake_init_ok(monkeypatch)

    def unsupported(*_):
        raise pynvml.NVMLError(code)

    assert nvml.query(unsupported, 1) is nvml.NA
    assert nvml.query(unsupported, default=-1) == -1
    assert nvml.query("nvmlThisFunctionDoesNotExist") is nvml.NA


def test_query_decodes_bytes(monkeypatch):
    _fake_init_ok(monkeypatch)
    assert nvml.query(lambda: b"NVIDIA H200") == "NVIDIA H200"


def test_memory_info_prefers_v2_and_falls_back_to_v1(monkeypatch):
    _fake_init_ok(monkeypatch)
    calls = []

    def mem(handle, version=None):
        calls.append(version)
        if version is not None:
            return SimpleNamespace(total=100, free=60, used=30, reserved=10)
        return SimpleNamespace(total=100, free=70, used=30)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", mem)
    info = nvml.memory_info("h")
    assert (info.total, info.free, info.used, info.reserved) == (100, 60, 30, 10)

    def mem_v1_only(handle, version=None):
        if version is not None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return SimpleNamespace(total=100, free=70, used=30)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", mem_v1_only)
    info = nvml.memory_info("h")
    assert (info.total, info.free, info.reserved) == (100, 70, nvml.NA)


def test_compute_processes_and_versions(monkeypatch):
    _fake_init_ok(monkeypatch)
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetComputeRunningProcesses",
        lambda h: [
            SimpleNamespace(pid=11, usedGpuMemory=512 * 1024**2),
            SimpleNamespace(pid=12, usedGpuMemory=None),
        ],
    )
    monkeypatch.setattr(pynvml, "nvmlSystemGetProcessName", lambda pid: f"python{pid}")
    monkeypatch.setattr(pynvml, "nvmlSystemGetCudaDriverVersion_v2", lambda: 13000)
    procs = nvml.compute_processes("h")
    assert [(p.pid, p.used_memory, p.name) for p in procs] == [
        (11, 512 * 1024**2, "python11"),
        (12, nvml.NA, "python12"),
    ]
    assert nvml.cuda_driver_version() == "13.0"
