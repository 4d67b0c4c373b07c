"""What a :func:`gpucheck.check_op` battery is asked to check: :class:`OpSpec`, the checks
and dtypes there are, the tolerances where none is given. Below the runner and the API."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpucheck import testing

FLOAT_DTYPES = testing.FLOAT_DTYPES
#: (rtol, atol) by dtype where none is given: torch.testing.assert_close's defaults
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
}
#: checks made once per claimed dtype, and once per op
PER_DTYPE = ("devices", "numerics", "determinism", "cross_device", "memory")
PER_OP = ("dtypes", "opcheck", "gradcheck")
SEED_ENV = "GPUCHECK_SEED"


@dataclass(frozen=True)
class OpSpec:
    """What :func:`check_op` was asked to check (also the test function's ``gpucheck_op``)."""

    op: Any
    name: str
    make_inputs: Callable[..., Any]
    reference: Callable[..., Any] | None
    dtypes: tuple[str, ...]
    backward: bool | tuple[int, ...]
    devices: tuple[int, ...] | None  # None: every target device
    repeats: int
    rtol: dict[str, float]
    atol: dict[str, float]
    low_precision_factor: float
    deterministic: bool
    torch_op: bool
    checks: tuple[str, ...] = field(default=())


def op_name(op: Any) -> str:
    """``namespace::name`` of a torch op, ``module.qualname`` of anything else."""
    packet = getattr(op, "overloadpacket", op)
    qual = getattr(packet, "_qualified_op_name", None)
    if qual:
        return str(qual)
    module = getattr(op, "__module__", None) or type(op).__module__
    name = getattr(op, "__qualname__", None) or getattr(op, "__name__", None) or repr(op)
    return f"{module}.{name}" if module and module != "builtins" else str(name)


def is_torch_op(op: Any) -> bool:
    """True for ``torch.ops.<ns>.<op>`` (packet or overload)."""
    try:
        from torch._ops import OpOverload, OpOverloadPacket
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return isinstance(op, (OpOverload, OpOverloadPacket))
