"""Enumerate CUDA devices through the driver API without creating a CUDA context.

Run as ``python -m gpucheck._cuda_probe``: prints one JSON object. It runs in a subprocess
(like nvitop's mapping) so that the caller's process never initializes CUDA: a parent that has
called ``cuInit`` cannot fork CUDA workers, and discovery must leave no context anywhere.
Only context-free driver calls are used (cuDeviceGet*, cuDeviceCanAccessPeer,
cuDevicePrimaryCtxGetState); the driver applies CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER
exactly as it will for the real workload.
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

# CUdevice_attribute values (cuda.h)
_CC_MAJOR, _CC_MINOR = 75, 76


def _uuid_str(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def probe() -> dict[str, Any]:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        return {"ok": False, "error": "LIBCUDA_NOT_FOUND", "message": str(err)}

    def err_name(code: int) -> str:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(name))
        return (name.value or b"CUDA_ERROR_UNKNOWN").decode()

    def call(fn: str, *args: Any) -> None:
        code = getattr(cuda, fn)(*args)
        if code != 0:
            raise RuntimeError(f"{fn}: {err_name(code)}")

    try:
        call("cuInit", 0)
        version = ctypes.c_int()
        call("cuDriverGetVersion", ctypes.byref(version))
        count = ctypes.c_int()
        call("cuDeviceGetCount", ctypes.byref(count))
        handles = []
        devices = []
        for i in range(count.value):
            dev = ctypes.c_int()
            call("cuDeviceGet", ctypes.byref(dev), i)
            handles.append(dev)
            name = ctypes.create_string_buffer(256)
            call("cuDeviceGetName", name, 256, dev)
            uuid = ctypes.create_string_buffer(16)
            call("cuDeviceGetUuid_v2", uuid, dev)
            bus = ctypes.create_string_buffer(64)
            call("cuDeviceGetPCIBusId", bus, 64, dev)
            total = ctypes.c_size_t()
            call("cuDeviceTotalMem_v2", ctypes.byref(total), dev)
            major, minor = ctypes.c_int(), ctypes.c_int()
            call("cuDeviceGetAttribute", ctypes.byref(major), _CC_MAJOR, dev)
            call("cuDeviceGetAttribute", ctypes.byref(minor), _CC_MINOR, dev)
            flags, active = ctypes.c_uint(), ctypes.c_int()
            call("cuDevicePrimaryCtxGetState", dev, ctypes.byref(flags), ctypes.byref(active))
            devices.append(
                {
                    "cuda_index": i,
                    "uuid": _uuid_str(uuid.raw),
                    "name": name.value.decode(errors="replace"),
                    "pci_bus_id": bus.value.decode(errors="replace"),
                    "total_memory": total.value,
                    "compute_capability": f"{major.value}.{minor.value}",
                    "primary_context_active": bool(active.value),
                }
            )
        peer: list[list[bool | None]] = []
        for a in handles:
            row: list[bool | None] = []
            for b in handles:
                if a.value == b.value:
                    row.append(None)
                    continue
                can = ctypes.c_int()
                call("cuDeviceCanAccessPeer", ctypes.byref(can), a, b)
                row.append(bool(can.value))
            peer.append(row)
    except RuntimeError as err:
        return {"ok": False, "error": str(err).split(": ")[-1], "message": str(err)}
    return {"ok": True, "driver_cuda_version": version.value, "devices": devices, "peer": peer}


if __name__ == "__main__":
    json.dump(probe(), sys.stdout)
    sys.stdout.write("\n")
