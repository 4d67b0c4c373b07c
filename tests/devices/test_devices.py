"""Device discovery: CUDA ordinal <-> NVML index through UUIDs, CUDA_VISIBLE_DEVICES rules."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from gpucheck import devices, nvml

UUIDS = [
    "GPU-1d8f3b2a-0000-1111-2222-333344445555",
    "GPU-9c4e7a10-aaaa-bbbb-cccc-ddddeeeeffff",
    "GPU-9c4e7a11-aaaa-bbbb-cccc-000011112222",
]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, [0, 1, 2]),
        ("", []),
        ("1", [1]),
        ("2,0", [2, 0]),
        (" 1 , 2 ", [1, 2]),
        ("0,7,1", [0]),  # the list ends at the first invalid entry
        ("1,1,2", [1]),  # a repeat ends it too
        ("-1,0", []),
        ("GPU-9c4e7a11", [2]),  # UUID prefix
        ("gpu-1d8f3b2a-0000-1111-2222-333344445555,0", [0]),  # full UUID, then a repeat
        ("GPU-9c4e7a1", []),  # ambiguous prefix
        ("GPU-ffff", []),  # unknown UUID
        ("2,GPU-1d8f", [2, 0]),
        ("MIG-abc", []),
        ("0,,1", [0]),
    ],
)
def test_parse_visible_devices_follows_the_driver_rules(value, expected):
    assert devices.parse_visible_devices(value, UUIDS) == expected


def test_map_by_uuid_never_assumes_orders_agree():
    cuda_order = [UUIDS[2].upper().replace("GPU-", "GPU-"), UUIDS[0], "GPU-not-in-nvml"]
    assert devices.map_by_uuid(cuda_order, UUIDS) == [2, 0, None]


@pytest.fixture
def fake_nvml(monkeypatch):
    """A 3-GPU NVML: handles are ints, each query answers from tables."""
    nvml.reset()
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 3)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: UUIDS[h])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: "NVIDIA H200")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCudaComputeCapability", lambda h: (9, 0))
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetPciInfo",
        lambda h: SimpleNamespace(busId=f"00000000:{h + 0x18:02X}:00.0"),
    )
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetMemoryInfo",
        lambda h, version=None: SimpleNamespace(
            total=150 << 30, free=(149 - h) << 30, used=(1 + h) << 30, reserved=0
        ),
    )
    monkeypatch.setattr(
        pynvml, "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=10 * h, memory=h)
    )
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetComputeRunningProcesses",
        lambda h: [SimpleNamespace(pid=4000 + h, usedGpuMemory=600 << 20)] if h == 1 else [],
    )
    monkeypatch.setattr(pynvml, "nvmlSystemGetProcessName", lambda pid: "python3")
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "580.159.04")
    monkeypatch.setattr(pynvml, "nvmlSystemGetCudaDriverVersion_v2", lambda: 13000)
    monkeypatch.setattr(pynvml, "nvmlSystemGetNVMLVersion", lambda: "13.580.159.04")
    monkeypatch.setattr(
        pynvml, "nvmlDeviceGetP2PStatus", lambda a, b, cap: pynvml.NVML_P2P_STATUS_OK
    )
    yield
    nvml.reset()


def _probe(*nvml_indices, peer=True):
    devs = [
        {
            "cuda_index": c,
            "uuid": UUIDS[n],
            "name": "NVIDIA H200",
            "pci_bus_id": f"0000:{n + 0x18:02X}:00.0",
            "total_memory": 150 << 30,
            "compute_capability": "9.0",
            "primary_context_active": False,
        }
        for c, n in enumerate(nvml_indices)
    ]
    matrix = [[None if a == b else peer for b in range(len(devs))] for a in range(len(devs))]
    return {"ok": True, "driver_cuda_version": 13000, "devices": devs, "peer": matrix}


def test_discover_maps_cuda_ordinals_to_nvml_indices_by_uuid(fake_nvml, monkeypatch):
    # CUDA_VISIBLE_DEVICES=2,1: CUDA ordinal 0 is NVML device 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    inv = devices.discover(probe=_probe(2, 1))
    assert [(d.cuda_index, d.nvml_index) for d in inv.devices] == [(0, 2), (1, 1)]
    assert inv.mapping == "cuda-driver-uuid"
    d1 = inv.by_cuda_index(1)
    assert d1.uuid == UUIDS[1]
    assert [(p.pid, p.used_memory) for p in d1.processes] == [(4001, 600 << 20)]
    assert inv.by_cuda_index(0).processes == []
    assert d1.peer_access == [True, None]
    assert inv.driver_version == "580.159.04"
    assert inv.cuda_driver_version == "13.0"
    assert inv.by_cuda_index(0).memory_free == 147 << 30


def test_discover_single_visible_device_maps_to_its_nvml_index(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    inv = devices.discover(probe=_probe(1))
    assert [(d.cuda_index, d.nvml_index) for d in inv.devices] == [(0, 1)]


def test_discover_falls_back_to_visible_devices_when_libcuda_is_unusable(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-9c4e7a11,0")
    inv = devices.discover(probe={"ok": False, "error": "LIBCUDA_NOT_FOUND", "message": "x"})
    assert [(d.cuda_index, d.nvml_index) for d in inv.devices] == [(0, 2), (1, 0)]
    assert inv.mapping == "CUDA_VISIBLE_DEVICES"
    assert inv.by_cuda_index(0).peer_access == [None, True]
    assert any("PCI bus order" in n for n in inv.notes)


def test_discover_reports_hidden_devices(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    inv = devices.discover(probe={"ok": False, "error": "CUDA_ERROR_NO_DEVICE", "message": ""})
    assert inv.devices == []
    assert "hides all 3 GPU(s)" in inv.reason
    assert inv.environment_error is None


def test_discover_driver_mismatch_is_an_environment_error(fake_nvml):
    inv = devices.discover(
        probe={
            "ok": False,
            "error": "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
            "message": "cuInit: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        }
    )
    assert inv.devices == []
    assert "version mismatch" in inv.environment_error


def test_discover_on_a_machine_without_driver_says_so():
    nvml.reset()
    if nvml.status().ok:
        pytest.skip("this machine has an NVIDIA driver")
    inv = devices.discover()
    assert inv.devices == []
    assert inv.environment_error is None
    assert inv.reason.startswith("No NVIDIA GPU is usable")


def test_cuda_probe_subprocess_answers_in_json_without_libcuda():
    answer = devices.run_cuda_probe()
    if answer.get("ok"):
        pytest.skip("this machine has libcuda")
    assert answer["error"] == "LIBCUDA_NOT_FOUND"
