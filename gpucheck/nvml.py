"""The only module that talks to NVML (through nvidia-ml-py's ``pynvml``).

Every call goes through :func:`query`, which turns "not supported", "no permission", a missing
library or a missing function into the :data:`NA` sentinel instead of an exception (the pattern
of nvitop's ``nvmlQuery``). :func:`status` says whether NVML could be initialized and, if not,
why, in one sentence a user can act on. :func:`answer` tells the two kinds of NA apart: a value
this driver or device does not have, and a library that failed (``Unknown Error``, ``GPU is
lost``: NVML failing under a running program), which the sampler reports.

NVML never creates a CUDA context, so everything here is safe to call from the harness's parent
process and from a sampler thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

try:  # nvidia-ml-py is a dependency, but a broken environment must still get a clear sentence
    import pynvml as _nv
except ImportError:  # pragma: no cover - exercised by patching in tests
    _nv = None


class _NAType:
    """Sentinel for "this value is not available here" (falsy, prints as N/A, JSON null)."""

    _instance: _NAType | None = None

    def __new__(cls) -> _NAType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "N/A"

    __str__ = __repr__


NA: Any = _NAType()


def na_to_none(value: Any) -> Any:
    """NA -> None for JSON; anything else unchanged."""
    return None if value is NA else value


@dataclass(frozen=True)
class NvmlStatus:
    ok: bool
    reason: str | None = None  # one sentence when not ok
    no_driver: bool = False  # True when the machine simply has no NVIDIA driver / GPU


_lock = threading.Lock()
_status: NvmlStatus | None = None

# Why NVML failed to start, in words a user can act on.
_INIT_REASONS = {
    "NVMLError_LibraryNotFound": (
        "the NVIDIA driver's NVML library (libnvidia-ml.so.1) was not found, "
        "so no NVIDIA driver is installed on this machine",
        True,
    ),
    "NVMLError_DriverNotLoaded": ("the NVIDIA driver is not loaded", True),
    "NVMLError_LibRmVersionMismatch": (
        "the NVIDIA kernel driver and its user-space library have different versions "
        "(driver/library version mismatch, usually after a driver update without a reboot)",
        False,
    ),
    "NVMLError_NoPermission": ("this user has no permission to query the NVIDIA driver", False),
}


def status() -> NvmlStatus:
    """Initialize NVML once (thread-safe) and report whether it is usable."""
    global _status
    with _lock:
        if _status is None:
            _status = _init()
        return _status


def _init() -> NvmlStatus:
    if _nv is None:
        return NvmlStatus(False, "the Python package nvidia-ml-py (pynvml) is not installed")
    try:
        _nv.nvmlInit()
    except _nv.NVMLError as err:
        reason, no_driver = _INIT_REASONS.get(
            type(err).__name__, (f"NVML failed to initialize: {err}", False)
        )
        return NvmlStatus(False, reason, no_driver)
    except OSError as err:  # a library found but unloadable
        return NvmlStatus(False, f"the NVML library could not be loaded: {err}", True)
    return NvmlStatus(True)


def reset() -> None:
    """Forget the initialization state (tests; after a driver reload)."""
    global _status
    with _lock:
        if _status is not None and _status.ok and _nv is not None:
            with contextlib.suppress(_nv.NVMLError):
                _nv.nvmlShutdown()
        _status = None


#: NVML errors that say "this value does not exist here", not "the query failed"
_UNAVAILABLE = (
    "NVMLError_NotSupported",
    "NVMLError_NoPermission",
    "NVMLError_FunctionNotFound",
    "NVMLError_NotFound",
)


def answer(func: str | Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
    """Call a pynvml function: ``(value, None)``; ``(NA, None)`` where the value is not
    available here (NVML not initialized or not installed, the function missing from this
    driver, not supported by this device, no permission); ``(NA, why)`` where the library
    failed (any other NVML error, e.g. ``Unknown Error``, ``GPU is lost``). Bytes become str.
    """
    if not status().ok or _nv is None:
        return NA, None
    fn = getattr(_nv, func, None) if isinstance(func, str) else func
    if fn is None:
        return NA, None
    try:
        value = fn(*args)
    except _nv.NVMLError as err:
        if type(err).__name__ in _UNAVAILABLE:
            return NA, None
        return NA, f"{type(err).__name__}: {err}"
    except (AttributeError, TypeError):  # a pynvml older than this call
        return NA, None
    except Exception as err:  # pynvml's own (NVMLLibraryMismatchError: a driver without it)
        if "Mismatch" in type(err).__name__:
            return NA, None
        return NA, f"{type(err).__name__}: {err}"
    except OSError as err:
        return NA, f"{type(err).__name__}: {err}"
    if isinstance(value, bytes):
        return value.decode(errors="replace"), None
    return value, None


def query(func: str | Callable[..., Any], *args: Any, default: Any = NA) -> Any:
    """Call a pynvml function; return ``default`` where the answer is unavailable, for
    whatever reason (see :func:`answer`).

    ``func`` is a pynvml function or its name (``"nvmlDeviceGetUUID"``).
    """
    value, _ = answer(func, *args)
    return default if value is NA else value


# --- typed helpers used by devices.py and the NVML sampler -------------------------------------


def device_count() -> int:
    count = query("nvmlDeviceGetCount")
    return 0 if count is NA else int(count)


def handle(index: int) -> Any:
    return query("nvmlDeviceGetHandleByIndex", index)


def uuid(h: Any) -> Any:
    return query("nvmlDeviceGetUUID", h)


def name(h: Any) -> Any:
    return query("nvmlDeviceGetName", h)


def pci_bus_id(h: Any) -> Any:
    info = query("nvmlDeviceGetPciInfo", h)
    if info is NA:
        return NA
    bus = info.busId
    return bus.decode() if isinstance(bus, bytes) else str(bus)


def compute_capability(h: Any) -> Any:
    cc = query("nvmlDeviceGetCudaComputeCapability", h)
    return NA if cc is NA else f"{cc[0]}.{cc[1]}"


@dataclass(frozen=True)
class MemoryInfo:
    total: Any
    free: Any
    used: Any
    reserved: Any  # NA where the driver has only the v1 query


def memory_info(h: Any) -> MemoryInfo:
    """Memory of one device in bytes; the v2 query (with ``reserved``) where the driver has it."""
    if _nv is not None and hasattr(_nv, "nvmlMemory_v2"):
        info = query(lambda: _nv.nvmlDeviceGetMemoryInfo(h, version=_nv.nvmlMemory_v2))
        if info is not NA:
            return MemoryInfo(info.total, info.free, info.used, info.reserved)
    info = query("nvmlDeviceGetMemoryInfo", h)
    if info is NA:
        return MemoryInfo(NA, NA, NA, NA)
    return MemoryInfo(info.total, info.free, info.used, NA)


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_memory: Any  # bytes, or NA (not available e.g. under some virtualization)
    name: Any


def compute_processes(h: Any) -> list[ProcessInfo]:
    """Processes with a CUDA context on this device and the memory each one uses there."""
    return list_processes(h)[0]


def list_processes(h: Any, names: bool = True) -> tuple[list[ProcessInfo], str | None]:
    """:func:`compute_processes`, and why NVML failed to list them (None: it did not fail;
    an empty list then means none, or a device that cannot say). ``names=False``: each
    process's name is left NA (one NVML call a process less, for a sampler that needs only
    the memory)."""
    procs, failed = answer("nvmlDeviceGetComputeRunningProcesses", h)
    if procs is NA:
        return [], failed
    out = []
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        out.append(
            ProcessInfo(
                int(p.pid),
                NA if used is None else int(used),
                query("nvmlSystemGetProcessName", p.pid) if names else NA,
            )
        )
    return out, None


def utilization(h: Any) -> tuple[Any, Any]:
    """(gpu %, memory %) over the driver's last sample period."""
    rates = query("nvmlDeviceGetUtilizationRates", h)
    return (NA, NA) if rates is NA else (rates.gpu, rates.memory)


def p2p_read_ok(h1: Any, h2: Any) -> Any:
    """Whether NVML reports peer-to-peer reads between two devices (NA if unknown)."""
    if _nv is None:
        return NA
    st = query("nvmlDeviceGetP2PStatus", h1, h2, getattr(_nv, "NVML_P2P_CAPS_INDEX_READ", 0))
    return NA if st is NA else st == getattr(_nv, "NVML_P2P_STATUS_OK", 0)


def driver_version() -> Any:
    return query("nvmlSystemGetDriverVersion")


def cuda_driver_version() -> Any:
    """The CUDA version the driver supports, as "13.0"."""
    v = query("nvmlSystemGetCudaDriverVersion_v2")
    if v is NA:
        v = query("nvmlSystemGetCudaDriverVersion")
    return NA if v is NA else f"{v // 1000}.{(v % 1000) // 10}"


def nvml_version() -> Any:
    return query("nvmlSystemGetNVMLVersion")
