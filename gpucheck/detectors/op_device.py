"""Per-op checks on every call of an extension op (:mod:`gpucheck.detectors.op_watch`).

Every op called from Python that is not one of torch's own (``aten``, ``prim``) is watched —
extension ops registered with ``TORCH_LIBRARY``, such as ``gpucheck::*``, forward and the
backward ops that Python autograd formulas call — and every function of a compiled extension
module (pybind11, :mod:`gpucheck.detectors.ext_watch`, named ``package._C.function``), also
when the autograd engine calls it from an ``autograd.Function``'s backward:

- ``wrong-device``: an output (a result, or a gradient in backward) on another device than
  the op's tensor inputs: the extension allocated with ``torch::kCUDA`` / the current device
  instead of ``x.options()``;
- ``device-state-leak``: the current CUDA device after the op differs from before it (a bare
  ``cudaSetDevice``), naming the op.

Each detail names the Python line that made the call (``called from file.py:12 in
Fn.forward``).
"""

from __future__ import annotations

import sys
from typing import Any

from gpucheck.detectors import op_watch
from gpucheck.detectors.base import CallWatcher, CaseInfo
from gpucheck.detectors.device_state import HINT as LEAK_HINT
from gpucheck.model.results import Finding

TORCH_NAMESPACES = op_watch.TORCH_NAMESPACES
ALLOC_HINT = (
    "allocate outputs with the input's options (`at::empty(sizes, x.options())`), "
    "not `torch::kCUDA` or the current device, and guard the entry point with "
    "`const at::cuda::OptionalCUDAGuard guard(device_of(x));`"
)


def _tensor_devices(found: list[Any]) -> list[str]:
    """The devices of the tensors that hold data (placeholders left out: an empty CPU tensor
    returned for an output that is not computed is a convention, not a device)."""
    return [str(t.device) for t in found if not op_watch.placeholder(t)]


def _current_device() -> int | None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.current_device())


def op_events(
    name: str, inputs: list[str], outputs: list[str], before: int | None, after: int | None
) -> list[tuple[str, str]]:
    """(kind, detail) of what one call of op ``name`` did wrong: plain data in, so the rule is
    testable without a GPU."""
    found = []
    if inputs:
        wrong = sorted(set(outputs) - set(inputs))
        if wrong and len(set(inputs)) == 1:
            found.append(
                ("wrong-device", f"{name}: inputs on {inputs[0]}, output(s) on {', '.join(wrong)}")
            )
    if before is not None and after is not None and before != after:
        found.append(
            (
                "device-state-leak",
                f"{name}: the current device was cuda:{before} "
                f"before the call and cuda:{after} after it",
            )
        )
    return found


class OpDevice(CallWatcher):
    """Watches every extension op of the case body; one finding per (kind, op)."""

    name = "op-device"
    touches_gpu = False  # what it saw of the calls before an error stands

    def __init__(self) -> None:
        self.watching = False
        self.seen: dict[tuple[str, str], list[str]] = {}

    # op_watch listener
    def before(self, call: op_watch.Call) -> None:
        call.notes["op-device"] = _current_device()

    def after(self, call: op_watch.Call, out: Any) -> None:
        if call.error is not None:
            return
        where = f" (called from {call.frame})" if call.frame else ""
        for kind, detail in op_events(
            call.op,
            _tensor_devices(call.inputs),
            _tensor_devices(call.outputs(out)),
            call.notes.get("op-device"),
            _current_device(),
        ):
            self.seen.setdefault((kind, call.op), []).append(detail + where)

    def case_started(self, case: CaseInfo) -> None:
        self.seen = {}
        self.start_watching()

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        if not self.stop_watching():
            return []
        found = []
        for (kind, op), details in sorted(self.seen.items()):
            calls = f" ({len(details)} calls)" if len(details) > 1 else ""
            found.append(
                case.finding(
                    kind,
                    "error" if kind == "wrong-device" else "warning",
                    f"op {op} returned a tensor on another device than its inputs{calls}"
                    if kind == "wrong-device"
                    else f"op {op} changed the current CUDA device and did not restore it{calls}",
                    op=op,
                    evidence="\n".join(dict.fromkeys(details))[:2000],
                    hint=ALLOC_HINT if kind == "wrong-device" else LEAK_HINT,
                )
            )
        self.seen = {}
        return found
