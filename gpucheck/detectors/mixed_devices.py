"""mixed-devices: a call whose tensor arguments sit on different devices, named before it runs.

A 3DGS rasterizer given its background colour as a CPU tensor (a config slip) hands the
kernel a host pointer: on most systems the kernel faults with "an illegal memory access", the
process's CUDA context is lost, and the failure surfaces later, at an unrelated line. Two
GPUs' tensors in one call fault the same way (or, with peer access, read over NVLink). The
extension's own checks would have said so in one line; many extensions have none.

Around every watched call (``torch.ops`` of any namespace but torch's, and the functions of
compiled extension modules, :mod:`gpucheck.detectors.ext_watch`) this detector looks at the
tensor arguments *before* the call runs, so the finding exists even when the kernel then
kills the context: it is also handed to :attr:`MixedDevices.persist` at once (the worker
writes it to its state file, which outlives a crash).

The rule (:func:`mixed`): the call has a tensor on an accelerator (CUDA, or any device but
the CPU) and its tensors that carry data are on two or more devices. A CPU tensor that torch
itself lets a CUDA op take is not data here: a 0-dim tensor (a scalar), and an integer or
bool tensor of at most :data:`SMALL_HOST` elements (a size, a shape, a seed). Nor is a
tensor with no elements on any device (:func:`~gpucheck.detectors.op_watch.placeholder`):
the rasterizers pass ``torch.Tensor([])`` for an argument that is not given and test
``.size(0)`` in C++. A call that the
extension refuses itself (it raises an error that is not a CUDA error: a ``TORCH_CHECK``
saying "must be a CUDA tensor", as gpucheck's own suites test on purpose) is fine: its check
did the job, and the finding made before the call is withdrawn. An extension that takes
another host tensor by design (and copies it itself) is reported: leave its function
unwatched (``GPUCHECK_UNWATCHED=pkg._C.fn``).
"""

from __future__ import annotations

import inspect
import re
import sys
import threading
from collections.abc import Callable
from typing import Any

from gpucheck.detectors import op_watch
from gpucheck.detectors.base import CallWatcher, CaseInfo, WorkerContext
from gpucheck.errors import CUDA_ERROR_MARKERS
from gpucheck.model.kinds import Kind
from gpucheck.model.results import MIXED_DEVICES, Finding

#: integer / bool CPU tensors up to this many elements are host-side arguments (sizes)
SMALL_HOST = 8
MAX_EVIDENCE = 2000
_DOC_SIGNATURE = re.compile(r"^\s*[\w.]+\((?P<params>.*)\)\s*(->.*)?$")
_DEFAULT_NAME = re.compile(r"arg\d+")


def host_argument(t: Any) -> bool:
    """A CPU tensor torch lets a CUDA op take: 0-dim, or a small integer / bool tensor."""
    if t.device.type != "cpu":
        return False
    return t.dim() == 0 or (
        not (t.is_floating_point() or t.is_complex()) and t.numel() <= SMALL_HOST
    )


def carries_data(t: Any) -> bool:
    """Whether a tensor argument counts for the rule: neither a host argument nor a
    placeholder."""
    return not (host_argument(t) or op_watch.placeholder(t))


def split_params(text: str) -> list[str]:
    """The top-level comma-separated parts of a signature's parameter list."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def argument_names(fn: Any) -> list[str]:
    """The parameter names of a watched callable, where it tells them: a torch op's schema,
    a pybind11 function's signature line (``f(means: torch.Tensor, bg: torch.Tensor)``;
    pybind's ``arg0``... count as unnamed), a Python function's signature."""
    schema = getattr(fn, "_schema", None)
    if schema is None and hasattr(fn, "overloads"):  # an OpOverloadPacket: its default
        schema = getattr(getattr(fn, "default", None), "_schema", None)
    if schema is not None:
        return [str(a.name) for a in schema.arguments]
    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    found = _DOC_SIGNATURE.match(doc[0]) if doc else None
    if found:
        names = [
            p.split(":")[0].split("=")[0].strip().lstrip("*") for p in split_params(found["params"])
        ]
        return ["" if _DEFAULT_NAME.fullmatch(n) else n for n in names]
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def labelled_tensors(
    args: tuple[Any, ...], kwargs: dict[str, Any], names: list[str]
) -> list[tuple[str, Any]]:
    """(label, tensor) of every tensor argument: ``argument 2 (bg)``, ``argument bg``,
    ``argument 1[0]`` for a tensor inside a list argument."""
    torch = sys.modules["torch"]
    out: list[tuple[str, Any]] = []

    def visit(label: str, value: Any, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            out.append((label, value))
        elif isinstance(value, (list, tuple)) and depth < 2:
            for j, v in enumerate(value):
                visit(f"{label}[{j}]", v, depth + 1)
        elif isinstance(value, dict) and depth < 2:
            for k, v in value.items():
                visit(f"{label}[{k!r}]", v, depth + 1)

    for i, a in enumerate(args):
        name = names[i] if i < len(names) and names[i] else ""
        visit(f"argument {i}" + (f" ({name})" if name else ""), a, 0)
    for k, a in kwargs.items():
        visit(f"argument {k}", a, 0)
    return out


def mixed(tensors: list[tuple[str, Any]]) -> list[tuple[str, str, tuple[int, ...], str]]:
    """(label, device, shape, dtype) of the data-carrying tensor arguments when they sit on
    two or more devices, one of them not the CPU; [] when the call is fine."""
    data = [(label, t) for label, t in tensors if carries_data(t)]
    devices = {str(t.device) for _, t in data}
    if len(devices) < 2 or devices <= {"cpu"}:
        return []
    return [
        (label, str(t.device), tuple(t.shape), str(t.dtype).removeprefix("torch."))
        for label, t in data
    ]


def describe(found: list[tuple[str, str, tuple[int, ...], str]]) -> str:
    """``argument 2 (bg) on cpu; argument 0 (means), argument 1 on cuda:0``."""
    by: dict[str, list[str]] = {}
    for label, device, _, _ in found:
        by.setdefault(device, []).append(label)
    order = sorted(by, key=lambda d: (d != "cpu", d))  # the odd ones (CPU) first
    return "; ".join(f"{', '.join(by[d])} on {d}" for d in order)


def hint(found: list[tuple[str, str, tuple[int, ...], str]]) -> str:
    """What to do, naming the arguments to move and where to."""
    devices = [d for _, d, _, _ in found]
    target = max(set(devices), key=lambda d: (d != "cpu", devices.count(d)))
    move = [label for label, d, _, _ in found if d != target]
    what = (
        "a kernel handed a host pointer faults with an illegal memory access (or reads "
        "host memory, unordered, where the system lets the GPU read pageable memory)"
        if "cpu" in devices
        else "a kernel handed another GPU's memory faults (or, with peer access, reads it "
        "over NVLink)"
    )
    return (
        f"{describe(found)}: pass {', '.join(move)} on {target} like the call's other "
        f"tensors (`.to({target!r})` before the call); {what}. This is the caller's "
        "argument, not the extension's device guard; if the extension takes this argument "
        "on the host by design, leave the function unwatched (GPUCHECK_UNWATCHED)"
    )


#: a call's tensor arguments on two devices: it explains the CUDA error of its case
MIXED = Kind(MIXED_DEVICES, precedence=20)


class MixedDevices(CallWatcher):
    """Looks at every watched call's tensor arguments before it runs; one finding per op."""

    name = MIXED_DEVICES
    kinds = (MIXED,)
    touches_gpu = False  # what it saw of the calls before an error stands

    def __init__(self) -> None:
        self.watching = False
        self.lock = threading.Lock()
        self.case: CaseInfo | None = None
        self.seen: dict[str, list[Any]] = {}  # op -> [detail, evidence, hint, frame, calls]
        #: called with the case's findings each time a new one is made (before the call
        #: runs): the worker writes them where a crash of the call does not lose them
        self.persist: Callable[[list[Finding]], None] | None = None

    def bind(self, worker: WorkerContext) -> None:
        self.persist = worker.persist

    def before(self, call: op_watch.Call) -> None:
        if len({t.device for t in call.inputs}) < 2:
            return  # the common case, without naming anything
        found = mixed(labelled_tensors(call.args, call.kwargs, argument_names(call.fn)))
        if not found:
            return
        with self.lock:
            call.notes[self.name] = True
            known = self.seen.get(call.op)
            if known is not None:
                known[4] += 1
                return
            evidence = "\n".join(
                f"{label}: {device}, shape {list(shape)}, {dtype}"
                for label, device, shape, dtype in found
            )
            self.seen[call.op] = [describe(found), evidence, hint(found), call.frame, 1]
            findings = self.findings()
        if self.persist is not None:
            self.persist(findings)

    def after(self, call: op_watch.Call, out: Any) -> None:
        """The extension refused the call with an error of its own: withdraw it."""
        if not call.notes.get(self.name) or call.error is None:
            return
        if any(m in str(call.error) for m in CUDA_ERROR_MARKERS):
            return  # the kernel faulted: the finding explains it
        with self.lock:
            known = self.seen.get(call.op)
            if known is None:
                return
            known[4] -= 1
            if known[4] > 0:
                return
            del self.seen[call.op]
            findings = self.findings()
        if self.persist is not None:
            self.persist(findings)

    def findings(self) -> list[Finding]:
        """The case's findings so far."""
        case = self.case
        if case is None:  # no case under way: nothing was watched
            return []
        out = []
        for op, (detail, evidence, fix, frame, calls) in sorted(self.seen.items()):
            where = f" (called from {frame})" if frame else ""
            times = f" ({calls} calls)" if calls > 1 else ""
            out.append(
                case.finding(
                    self.name,
                    "error",
                    f"{op} was called with tensor arguments on different devices: "
                    f"{detail}{times}{where}",
                    op=op,
                    evidence=(
                        f"tensor arguments (looked at before the call ran):\n{evidence}"
                        + (f"\ncalled from {frame}" if frame else "")
                    )[:MAX_EVIDENCE],
                    hint=fix,
                )
            )
        return out

    def case_started(self, case: CaseInfo) -> None:
        self.case, self.seen = case, {}
        self.start_watching()

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        if not self.stop_watching():
            return []
        found = self.findings()
        self.seen = {}
        return found
