"""A case record's ``memory``: the peaks the worker measured while the case ran.

The worker measures PyTorch's peaks on the target device (allocated, reserved, and what was
allocated when the case started: what earlier cases left) and, in NVML modes, this process's
peak on the target GPU and on every other GPU (by UUID: a context there is a stray one). A
peak that was not measured (no CUDA in the process, NVML off or failing, a record the
controller wrote for a crash) is ``None`` and is not written: absent means unknown, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


def _bytes(value: Any) -> int | None:
    """A byte count as read: a non-negative integer, else unknown."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


@dataclass
class Memory:
    """A case's memory peaks in bytes (``None``: not measured)."""

    #: PyTorch's peak allocated on the target device during the case
    torch_peak_allocated: int | None = None
    #: PyTorch's peak reserved (its caching allocator's pool) on the target device
    torch_peak_reserved: int | None = None
    #: this process's NVML peak on the target GPU (context included)
    nvml_peak_used: int | None = None
    #: PyTorch's allocated on the target when the case started (earlier cases' leftovers)
    torch_allocated_at_start: int | None = None
    #: this process's NVML peaks on the other GPUs, by UUID, those above 0 (``{}``: sampled,
    #: none held; ``None``: not sampled)
    nvml_peak_other_devices: dict[str, int] | None = None

    @property
    def own_peak(self) -> int | None:
        """The case's own PyTorch peak: the peak allocated above what the case started with
        (None when not measured or not above it)."""
        if not self.torch_peak_allocated:
            return None
        own = self.torch_peak_allocated - (self.torch_allocated_at_start or 0)
        return own if own > 0 else None

    @property
    def outside_pool(self) -> int | None:
        """The NVML peak less PyTorch's peak reserved pool (0 at least: the sampler may
        miss); the NVML peak itself where the pool is unknown."""
        if self.nvml_peak_used is None:
            return None
        if self.torch_peak_reserved is None:
            return self.nvml_peak_used
        return max(0, self.nvml_peak_used - self.torch_peak_reserved)

    @property
    def other_devices(self) -> dict[str, int]:
        """The other GPUs this process held memory on (UUID -> bytes above 0; none when not
        sampled)."""
        return {u: b for u, b in (self.nvml_peak_other_devices or {}).items() if b > 0}

    def to_json(self) -> dict[str, Any]:
        """The record's ``memory`` object: the peaks measured (an unknown one left out)."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}

    @classmethod
    def from_json(cls, value: Any) -> Memory:
        """``memory`` as read back (tolerant: a field that is not a byte count is unknown; an
        other-device entry that is not one is left out)."""
        if not isinstance(value, dict):
            return cls()
        others = value.get("nvml_peak_other_devices")
        return cls(
            torch_peak_allocated=_bytes(value.get("torch_peak_allocated")),
            torch_peak_reserved=_bytes(value.get("torch_peak_reserved")),
            nvml_peak_used=_bytes(value.get("nvml_peak_used")),
            torch_allocated_at_start=_bytes(value.get("torch_allocated_at_start")),
            nvml_peak_other_devices={
                str(uuid)[:200]: used for uuid, used in others.items() if _bytes(used) is not None
            }
            if isinstance(others, dict)
            else None,
        )
