"""NVML memory sampling (mode ``nvml``).

Two users of one sampler class:

* the harness's parent samples every device (total used memory and each process's memory)
  into the run's timeline file (its format and writer: :mod:`gpucheck.model.timeline`);
* each worker samples its *own* process on every device and keeps the peak per case, which
  goes into the case record (``memory.nvml_peak_used`` on the target device, and
  ``memory.nvml_peak_other_devices`` where the process also holds memory elsewhere: a context
  it created on a device it was not asked to use);
* a test samples its own process with :class:`NvmlTracker` (the plugin's ``nvml_tracker``
  fixture).

NVML never creates a CUDA context, so sampling does not disturb what it measures. NVML may
fail under a running program (``Unknown Error``, ``GPU is lost``): a sample that could not list
a device's processes says so (its row's ``error``, ``processes`` None), the sampler counts such
samples and goes on, and a case during which one failed has no NVML peak (None, not 0).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from gpucheck import nvml
from gpucheck.model.timeline import DeviceRow


class Sampler:
    """Calls ``sample()`` on a daemon thread every ``interval`` seconds until ``stop()``."""

    def __init__(
        self,
        interval: float,
        on_sample: Callable[[float, list[DeviceRow]], None],
        pid: int | None = None,
    ) -> None:
        self.interval = interval
        self.on_sample = on_sample
        self.pid = pid  # only this process's memory, or every process when None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        handles = [nvml.handle(i) for i in range(nvml.device_count())]
        self.devices = [
            (i, h, str(nvml.uuid(h))) for i, h in enumerate(handles) if h is not nvml.NA
        ]
        self.samples = 0
        self.busy_s = 0.0  # time spent sampling (its own overhead)
        self.failures = 0  # samples in which NVML failed on some device
        self.first_failure: tuple[float, str] | None = None  # when, and why

    def _failed(self, why: str) -> None:
        self.failures += 1
        if self.first_failure is None:
            self.first_failure = (time.time(), why)

    @property
    def available(self) -> bool:
        return bool(self.devices)

    def sample(self) -> list[DeviceRow]:
        rows = []
        failed = None
        for index, h, uuid in self.devices:
            procs, why = nvml.list_processes(h, names=False)  # the memory is all it keeps
            if self.pid is not None:
                procs = [p for p in procs if p.pid == self.pid]
            mem = nvml.memory_info(h) if self.pid is None else None
            rows.append(
                DeviceRow(
                    nvml_index=index,
                    uuid=uuid,
                    used=None if mem is None else nvml.na_to_none(mem.used),
                    processes=None
                    if why
                    else {str(p.pid): nvml.na_to_none(p.used_memory) for p in procs},
                    error=why or None,
                )
            )
            if why:
                failed = why
        if failed:
            self._failed(failed)
        return rows

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                self.on_sample(time.time(), self.sample())
            except Exception as err:  # the sampler never dies: it counts and goes on
                self._failed(f"{type(err).__name__}: {err}")
            self.samples += 1
            took = time.perf_counter() - t0
            self.busy_s += took
            self._stop.wait(max(0.0, self.interval - took))

    def start(self) -> Sampler:
        if self.available:
            self._thread = threading.Thread(target=self._run, name="gpucheck-nvml", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class CasePeaks:
    """Worker side: this process's peak memory per device while the current case runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._peaks: dict[str, int] = {}
        self._error: str | None = None

    def __call__(self, t: float, rows: list[DeviceRow]) -> None:
        mine = str(os.getpid())
        with self._lock:
            for row in rows:
                if row.error or row.processes is None:
                    self._error = self._error or str(row.error)
                    continue
                used = row.processes.get(mine)
                if used is not None and used > self._peaks.get(row.uuid, 0):
                    self._peaks[row.uuid] = used

    def reset(self) -> None:
        with self._lock:
            self._peaks = {}
            self._error = None

    def error(self) -> str | None:
        """Why NVML failed in a sample since the last reset (None: it did not)."""
        with self._lock:
            return self._error

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._peaks)


class NvmlTracker:
    """This process's GPU memory (NVML, every device) while a test runs.

    ``timeline``: ``(time, {device uuid: bytes})`` samples; :meth:`peak` the largest one on a
    device (or any); :meth:`sample` takes one now. Where NVML is unavailable ``available``
    is False, ``reason`` says why, and every value is :data:`gpucheck.nvml.NA`.
    """

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.timeline: list[tuple[float, dict[str, int]]] = []
        self._lock = threading.Lock()
        st = nvml.status()
        self.available = st.ok
        self.reason = st.reason
        self._sampler: Any = None
        if st.ok:
            self._sampler = Sampler(interval, self._on_sample, pid=os.getpid())
            if not self._sampler.available:
                self.available, self.reason = False, "NVML lists no device"

    def _on_sample(self, t: float, rows: list[DeviceRow]) -> None:
        mine = str(os.getpid())
        used = {r.uuid: int(b) for r in rows if (b := (r.processes or {}).get(mine)) is not None}
        with self._lock:
            self.timeline.append((t, used))

    def start(self) -> NvmlTracker:
        if self.available:
            self._sampler.start()
        return self

    def stop(self) -> None:
        if self.available:
            self._sampler.stop()
            self.sample()

    def sample(self) -> None:
        """Take one sample now (a test shorter than the interval still gets one)."""
        if self.available:
            self._on_sample(time.time(), self._sampler.sample())

    def peak(self, device: Any = None) -> Any:
        """The largest memory this process held on ``device`` (a ``torch.device``, CUDA
        index or NVML UUID; None: any device), in bytes; NA without NVML."""
        if not self.available:
            return nvml.NA
        uuid = None if device is None else _uuid_of(device)
        if device is not None and uuid is None:
            return nvml.NA
        with self._lock:
            values = [
                b for _, used in self.timeline for u, b in used.items() if uuid is None or u == uuid
            ]
        return max(values, default=0)

    def peaks(self) -> dict[str, int]:
        """The peak per device UUID."""
        out: dict[str, int] = {}
        with self._lock:
            for _, used in self.timeline:
                for u, b in used.items():
                    out[u] = max(out.get(u, 0), b)
        return out


def _uuid_of(device: Any) -> str | None:
    """NVML's UUID (``GPU-...``) of a CUDA device given as torch.device, index or UUID."""
    if isinstance(device, str) and device.startswith(("GPU-", "MIG-")):
        return device
    try:
        import torch

        index = device.index if isinstance(device, torch.device) else int(device)
        return f"GPU-{torch.cuda.get_device_properties(index).uuid}"
    except Exception:
        return None
