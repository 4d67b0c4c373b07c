"""Device discovery: which CUDA devices this process would see, and what NVML knows of them.

CUDA ordinals and NVML indices are different numberings (CUDA_VISIBLE_DEVICES re-numbers,
CUDA_DEVICE_ORDER may sort by speed); they are matched through UUIDs, never assumed equal.
The CUDA side is enumerated by the driver API in a subprocess (gpucheck._cuda_probe) so that
discovery creates no CUDA context, here or anywhere. Where libcuda is unusable, the mapping is
derived from CUDA_VISIBLE_DEVICES and NVML, and the inventory says so.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from gpucheck import nvml

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass
class ProcessUse:
    pid: int
    name: str | None
    used_memory: int | None  # bytes


@dataclass
class Device:
    cuda_index: int
    nvml_index: int | None
    uuid: str
    name: str
    compute_capability: str | None
    pci_bus_id: str | None
    memory_total: int | None
    memory_free: int | None
    memory_used: int | None
    memory_reserved: int | None
    utilization_gpu: int | None
    utilization_memory: int | None
    processes: list[ProcessUse] = field(default_factory=list)
    peer_access: list[bool | None] = field(default_factory=list)  # by CUDA index; None = self


@dataclass
class Inventory:
    devices: list[Device]
    reason: str | None  # why no device is listed, or None
    driver_version: str | None
    cuda_driver_version: str | None
    nvml_version: str | None
    torch_version: str | None
    cuda_visible_devices: str | None
    mapping: str  # "cuda-driver-uuid" | "CUDA_VISIBLE_DEVICES" | "none"
    environment_error: str | None = None  # a broken setup (exit 2), as opposed to no GPU
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def by_cuda_index(self, index: int) -> Device | None:
        return next((d for d in self.devices if d.cuda_index == index), None)


def parse_visible_devices(value: str | None, nvml_uuids: list[str]) -> list[int]:
    """NVML indices of the devices CUDA would expose, in CUDA order, per CUDA_VISIBLE_DEVICES.

    Follows the driver's rules: unset -> every device; entries are indices or (prefixes of)
    ``GPU-`` UUIDs; the list ends at the first entry that is invalid, unknown, ambiguous or a
    repeat. This is the fallback when libcuda cannot be asked directly (it assumes the driver
    enumerates in NVML/PCI order, i.e. CUDA_DEVICE_ORDER=PCI_BUS_ID).
    """
    if value is None:
        return list(range(len(nvml_uuids)))
    chosen: list[int] = []
    for raw in value.split(","):
        token = raw.strip()
        if not token:
            break
        index: int | None = None
        if token.lstrip("+-").isdigit():
            n = int(token)
            index = n if 0 <= n < len(nvml_uuids) else None
        elif token.upper().startswith("GPU-"):
            wanted = token.lower()
            hits = [i for i, u in enumerate(nvml_uuids) if u.lower().startswith(wanted)]
            index = hits[0] if len(hits) == 1 else None
        if index is None or index in chosen:
            break
        chosen.append(index)
    return chosen


def map_by_uuid(cuda_uuids: list[str], nvml_uuids: list[str]) -> list[int | None]:
    """For each CUDA ordinal, the NVML index with the same UUID (None where NVML lacks it)."""
    lookup = {u.lower(): i for i, u in enumerate(nvml_uuids)}
    return [lookup.get(u.lower()) for u in cuda_uuids]


def run_cuda_probe(timeout: float = 60.0) -> dict[str, Any]:
    """Run gpucheck._cuda_probe in a subprocess and return its JSON answer."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpucheck._cuda_probe"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "error": "TIMEOUT",
            "message": f"the CUDA driver did not answer within {timeout:.0f} s",
        }
    try:
        answer: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        answer = {
            "ok": False,
            "error": "PROBE_FAILED",
            "message": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}",
        }
    return answer


def torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


# Probe errors that mean "broken setup" rather than "no GPU here".
_BROKEN = {
    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH": "the CUDA driver library and the kernel driver "
    "have different versions (driver/library version mismatch)",
    "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE": "the CUDA forward-compatibility library "
    "does not support this GPU",
    "CUDA_ERROR_INVALID_DEVICE": f"{VISIBLE_ENV} names an invalid device",
}


def discover(probe: dict[str, Any] | None = None) -> Inventory:
    """Everything ``gpucheck devices`` shows. Creates no CUDA context in any process.

    Args:
        probe: an answer of gpucheck._cuda_probe to use instead of running it (tests).
    """
    visible = os.environ.get(VISIBLE_ENV)
    st = nvml.status()
    inv = Inventory(
        devices=[],
        reason=None,
        driver_version=nvml.na_to_none(nvml.driver_version()),
        cuda_driver_version=nvml.na_to_none(nvml.cuda_driver_version()),
        nvml_version=nvml.na_to_none(nvml.nvml_version()),
        torch_version=torch_version(),
        cuda_visible_devices=visible,
        mapping="none",
    )
    if not st.ok:
        inv.reason = f"No NVIDIA GPU is usable: {st.reason}."
        if not st.no_driver:
            inv.environment_error = inv.reason
        return inv

    handles = [nvml.handle(i) for i in range(nvml.device_count())]
    nvml_uuids = [str(nvml.uuid(h)) for h in handles]
    if not handles:
        inv.reason = "No NVIDIA GPU found: the driver is loaded but reports no devices."
        return inv

    answer = probe if probe is not None else run_cuda_probe()
    cuda_entries: list[dict[str, Any]]
    nvml_idx: list[int | None]
    if answer.get("ok"):
        cuda_entries = answer["devices"]
        nvml_idx = map_by_uuid([d["uuid"] for d in cuda_entries], nvml_uuids)
        peer = answer.get("peer") or []
        inv.mapping = "cuda-driver-uuid"
        active = [d["cuda_index"] for d in cuda_entries if d.get("primary_context_active")]
        if active:
            inv.notes.append(f"CUDA primary context already active on device(s) {active}")
    else:
        error = str(answer.get("error"))
        if error in _BROKEN:
            inv.reason = f"No CUDA device is usable: {_BROKEN[error]}."
            inv.environment_error = inv.reason
            return inv
        if error == "CUDA_ERROR_NO_DEVICE":
            inv.reason = (
                f"No CUDA device is visible: {VISIBLE_ENV}={visible!r} hides all "
                f"{len(handles)} GPU(s) NVML sees."
                if visible is not None
                else "No CUDA device is visible to the CUDA driver."
            )
            return inv
        cuda_entries, nvml_idx, peer = _by_visible_devices(visible, handles, nvml_uuids)
        inv.mapping = VISIBLE_ENV
        inv.notes.append(
            f"libcuda could not be asked ({answer.get('message')}); the mapping "
            f"follows {VISIBLE_ENV} and assumes PCI bus order"
        )

    for entry, n in zip(cuda_entries, nvml_idx, strict=False):
        inv.devices.append(
            _device(
                entry,
                n,
                handles[n] if n is not None else None,
                peer[entry["cuda_index"]] if peer else [],
            )
        )
    if not inv.devices:
        inv.reason = (
            f"No CUDA device is visible: {VISIBLE_ENV}={visible!r} hides all "
            f"{len(handles)} GPU(s) NVML sees."
        )
    return inv


def _by_visible_devices(
    visible: str | None, handles: list[Any], nvml_uuids: list[str]
) -> tuple[list[dict[str, Any]], list[int | None], list[list[bool | None]]]:
    """Where libcuda cannot be asked: the CUDA devices as :data:`VISIBLE_ENV` names them among
    NVML's (in PCI bus order), their NVML indices and NVML's peer-to-peer answers."""
    chosen = parse_visible_devices(visible, nvml_uuids)
    entries: list[dict[str, Any]] = [
        {"cuda_index": c, "uuid": nvml_uuids[n]} for c, n in enumerate(chosen)
    ]
    peer = [
        [
            None if a == b else nvml.na_to_none(nvml.p2p_read_ok(handles[a], handles[b]))
            for b in chosen
        ]
        for a in chosen
    ]
    return entries, list(chosen), peer


def _device(
    entry: dict[str, Any], nvml_index: int | None, h: Any, peer_row: list[bool | None]
) -> Device:
    na = nvml.na_to_none
    if h is None:  # the driver sees a device NVML does not (e.g. MIG); keep what CUDA told us
        mem = nvml.MemoryInfo(entry.get("total_memory"), None, None, None)
        util: tuple[Any, Any] = (None, None)
        procs: list[nvml.ProcessInfo] = []
    else:
        mem = nvml.memory_info(h)
        util = nvml.utilization(h)
        procs = nvml.compute_processes(h)
    return Device(
        cuda_index=entry["cuda_index"],
        nvml_index=nvml_index,
        uuid=entry["uuid"],
        name=entry.get("name") or na(nvml.name(h)),
        compute_capability=entry.get("compute_capability") or na(nvml.compute_capability(h)),
        pci_bus_id=entry.get("pci_bus_id") or na(nvml.pci_bus_id(h)),
        memory_total=na(mem.total),
        memory_free=na(mem.free),
        memory_used=na(mem.used),
        memory_reserved=na(mem.reserved),
        utilization_gpu=na(util[0]),
        utilization_memory=na(util[1]),
        processes=[ProcessUse(p.pid, na(p.name), na(p.used_memory)) for p in procs],
        peer_access=list(peer_row),
    )
