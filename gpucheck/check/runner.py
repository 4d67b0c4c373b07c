"""The checks of :func:`gpucheck.check_op` run here (``Runner``, one method each, and helpers);
what was asked is :class:`gpucheck.check.spec.OpSpec`, the public API :mod:`gpucheck.check.api`.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest

from gpucheck import testing
from gpucheck.check.spec import OpSpec
from gpucheck.errors import CUDA_ERROR_MARKERS
from gpucheck.worker.case import attach

LOW_PRECISION = ("float16", "bfloat16")
ALLOC_HINT = (
    "allocate outputs and gradients with the input's options "
    '(`at::empty(sizes, x.options())`), not `torch::kCUDA` / `device="cuda"` '
    "(the current device), and guard every entry point with "
    "`const at::cuda::OptionalCUDAGuard guard(device_of(x));`"
)
LEAK_HINT = (
    "use a scoped guard, which restores the caller's device on return "
    "(`const at::cuda::OptionalCUDAGuard guard(device_of(x));`), not a bare "
    "`cudaSetDevice`"
)
#: the autograd engine's complaint about a gradient on another device than its input
_ENGINE_DEVICE = re.compile(
    r"invalid gradient at index (\d+) - expected device (\S+) but got "
    r"(\S+)"
)


_NO_GRAD = (
    "{name}: backward was asked for, but no output requires grad (no autograd "
    "registered?); pass backward=False to check_op if the op has none"
)


def call_op(spec: OpSpec, args: Sequence[Any]) -> Any:
    """``spec.op(*args)``; a plain function's call is shown to the op watch's listeners
    (the worker-side detectors) like a torch op's."""
    if spec.torch_op:
        return spec.op(*args)
    from gpucheck.detectors import op_watch

    return op_watch.watch_call(spec.name, spec.op, *args)


def flat_tensors(out: Any) -> list[Any]:
    """The tensors of an op's result (a tensor, or nested tuples / lists / dicts)."""
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


class DeviceProblem(NamedTuple):
    """What the devices check found: a finding's kind, its message and its hint."""

    kind: str
    message: str
    hint: str


@dataclass
class Step:
    """One forward (and backward) call: outputs, gradients by argument position."""

    outputs: list[Any]
    grads: dict[int, Any]


class Runner:
    """The checks, one method each."""

    def __init__(self, spec: OpSpec, seed: int) -> None:
        self.spec = spec
        self.seed = seed

    # --- inputs and one call ---

    def inputs(self, device: Any, dtype: Any) -> tuple[Any, ...]:
        import torch

        torch.manual_seed(self.seed)
        made = self.spec.make_inputs(device, dtype)
        return tuple(made) if isinstance(made, (tuple, list)) else (made,)

    def diff_positions(self, args: Sequence[Any]) -> list[int]:
        import torch

        if self.spec.backward is False:
            return []
        floating = [
            i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()
        ]
        if self.spec.backward is True:
            return floating
        return [i for i in self.spec.backward if i in floating]

    def step(
        self,
        fn: Callable[[Sequence[Any]], Any],
        args: Sequence[Any],
        grad_seed: int | None = None,
        upcast: Any = None,
    ) -> Step:
        """Forward (and backward, with seeded output gradients) of ``fn`` on ``args``;
        ``upcast``: a dtype every floating tensor is cast to first (the reference)."""
        import torch

        def prep(a: Any) -> Any:
            if not isinstance(a, torch.Tensor):
                return a
            a = a.detach()
            return a.to(upcast) if upcast is not None and a.is_floating_point() else a

        args = [prep(a) for a in args]
        positions = self.diff_positions(args)
        for i in positions:
            args[i] = args[i].clone().requires_grad_()
        with torch.enable_grad():
            outputs = flat_tensors(fn(args))
        if not positions:
            return Step([o.detach() for o in outputs], {})
        diff = [o for o in outputs if o.requires_grad]
        if not diff:
            raise AssertionError(_NO_GRAD.format(name=self.spec.name))
        gen = torch.Generator().manual_seed(self.seed if grad_seed is None else grad_seed)
        gouts = [
            torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device, o.dtype)
            for o in diff
        ]
        grads = torch.autograd.grad(diff, [args[i] for i in positions], gouts, allow_unused=True)
        return Step(
            [o.detach() for o in outputs],
            {i: None if g is None else g.detach() for i, g in zip(positions, grads, strict=True)},
        )

    def kernel(self, args: Sequence[Any]) -> Step:
        return self.step(lambda a: call_op(self.spec, a), args)

    # --- checks ---

    def devices(self, device: Any, other: Any, dtype: Any) -> None:
        """Outputs and gradients on the inputs' device, and the caller's current device as it
        was after forward and after backward (``other`` current, where there is one)."""
        import torch

        args = self.inputs(device, dtype)
        before = _current_device()
        positions = self.diff_positions(args)
        step_args = [
            a.detach().clone().requires_grad_() if i in positions else a for i, a in enumerate(args)
        ]
        with torch.enable_grad():
            try:
                out = call_op(self.spec, step_args)
            except RuntimeError as err:
                _cuda_error(self.spec, err, other)
                raise
        outputs = flat_tensors(out)
        problems = [
            DeviceProblem(
                "wrong-device",
                f"{self.spec.name}: output {i} is on {o.device}, its inputs on {device}",
                ALLOC_HINT,
            )
            for i, o in enumerate(outputs)
            if o.device != device
        ]
        problems += self._left_current(before, "forward")
        diff = [o for o in outputs if o.requires_grad]
        if positions and not diff:
            raise AssertionError(_NO_GRAD.format(name=self.spec.name))
        if positions:
            problems += self._gradient_devices(diff, step_args, positions, other)
            problems += self._left_current(before, "backward")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if problems:
            self._attach_device_problems(problems, device, before, other)
            raise AssertionError("; ".join(p.message for p in problems))

    def _left_current(self, before: int | None, what: str) -> list[DeviceProblem]:
        """The current device changed by the op's ``what`` (forward, backward) since it was
        ``before``: the problem, and the caller's device made current again."""
        import torch

        after = _current_device()
        if after == before:
            return []
        torch.cuda.set_device(before)
        return [
            DeviceProblem(
                "device-state-leak",
                f"{self.spec.name}: {what} changed the current device from cuda:{before} to "
                f"cuda:{after}",
                LEAK_HINT,
            )
        ]

    def _gradient_devices(
        self, diff: list[Any], step_args: list[Any], positions: list[int], other: Any
    ) -> list[DeviceProblem]:
        """Backward from the outputs ``diff``: each gradient on its argument's device (one the
        autograd engine refused is named from its message)."""
        import torch

        gouts = [torch.ones_like(o) for o in diff]
        try:
            grads = torch.autograd.grad(
                diff, [step_args[i] for i in positions], gouts, allow_unused=True
            )
        except RuntimeError as err:
            m = _ENGINE_DEVICE.search(str(err))
            if m is None:
                _cuda_error(self.spec, err, other)
                raise
            return [
                DeviceProblem(
                    "wrong-device",
                    f"{self.spec.name}: backward returned the gradient {m.group(1)} on "
                    f"{m.group(3)}, its input is on {m.group(2)} (the autograd engine refused "
                    "it)",
                    ALLOC_HINT,
                )
            ]
        return [
            DeviceProblem(
                "wrong-device",
                f"{self.spec.name}: the gradient of argument {i} is on {g.device}, the "
                f"argument on {step_args[i].device}",
                ALLOC_HINT,
            )
            for i, g in zip(positions, grads, strict=False)
            if g is not None and g.device != step_args[i].device
        ]

    def _attach_device_problems(
        self, problems: list[DeviceProblem], device: Any, before: int | None, other: Any
    ) -> None:
        """Each problem as a finding of the case, with the devices it was seen with."""
        evidence = f"target {device}, current device before the call cuda:{before}" + (
            f" (another device, {other}, was made current)"
            if other
            else " (the only visible device)"
        )
        for problem in problems:
            attach(
                problem.kind,
                problem.message,
                op=self.spec.name,
                severity="warning" if problem.kind == "device-state-leak" else "error",
                hint=problem.hint,
                evidence=evidence,
            )

    def numerics(self, device: Any, other: Any, dtype: Any) -> None:
        import torch

        assert self.spec.reference is not None
        reference = self.spec.reference
        args = self.inputs(device, dtype)
        got = self.kernel(args)
        want = self.step(lambda a: reference(*a), args, upcast=torch.float64)
        name = str(dtype).removeprefix("torch.")
        base: Step | None = None
        if name in LOW_PRECISION:
            base = self.step(lambda a: reference(*a), args)
        failures = []
        for what, g, w, b in self._pairs(got, want, base):
            if g is None or w is None:
                if g is not w:
                    failures.append(
                        f"{what}: {'no' if g is None else 'a'} gradient where the "
                        f"reference has {'one' if g is None else 'none'}"
                    )
                continue
            if b is None:
                rtol, atol = self.spec.rtol[name], self.spec.atol[name]
                label = f"{self.spec.name} {what} {name} vs float64 reference"
            else:
                own = max(_max_err(b, w), _max_err(w.to(dtype), w))
                rtol = 0.0
                atol = self.spec.low_precision_factor * own + self.spec.atol[name]
                label = (
                    f"{self.spec.name} {what} {name} vs float64 reference (allowed: "
                    f"{self.spec.low_precision_factor:g} x the reference's own {name} "
                    f"error {own:.3g} + atol {self.spec.atol[name]:g})"
                )
            try:
                testing.assert_close(g, w, rtol=rtol, atol=atol, what=label)
            except AssertionError as err:
                failures.append(str(err))
        if failures:
            for f in failures:
                attach(
                    "numerics",
                    f"mismatch against the reference: {f}",
                    op=self.spec.name,
                    hint="the kernel's result is off by more than the tolerance of this "
                    "check; in float16 / bfloat16 a kernel that accumulates in the "
                    "low precision (instead of float32) fails here",
                )
            raise AssertionError("\n".join(failures))

    def _pairs(self, got: Step, want: Step, base: Step | None) -> list[tuple[str, Any, Any, Any]]:
        if len(got.outputs) != len(want.outputs):
            raise AssertionError(
                f"{self.spec.name}: {len(got.outputs)} output tensor(s), the "
                f"reference gives {len(want.outputs)}"
            )
        pairs = [
            (f"output {i}", g, w, None if base is None else base.outputs[i])
            for i, (g, w) in enumerate(zip(got.outputs, want.outputs, strict=True))
        ]
        pairs += [
            (
                f"gradient of argument {i}",
                got.grads[i],
                want.grads.get(i),
                None if base is None else base.grads.get(i),
            )
            for i in sorted(got.grads)
        ]
        return pairs

    def determinism(self, device: Any, other: Any, dtype: Any) -> None:
        if not self.spec.deterministic:
            pytest.skip("check_op(deterministic=False): not bitwise repeatable by design")
        args = self.inputs(device, dtype)
        first = self.kernel(args)
        for n in range(1, self.spec.repeats):
            again = self.kernel(args)
            bad = _differences(first, again)
            if bad:
                msg = (
                    f"{self.spec.name}: non-deterministic: call {n + 1} differs from call 1 "
                    f"on the same input ({'; '.join(bad)})"
                )
                attach(
                    "numerics",
                    msg,
                    op=self.spec.name,
                    hint="make the result a function "
                    "of the input alone (no float atomics whose order varies, no "
                    "uninitialized memory, no races), or pass deterministic=False",
                )
                raise AssertionError(msg)

    def cross_device(self, device: Any, other: Any, dtype: Any) -> None:
        if other is None:
            pytest.skip("needs a second visible CUDA device")
        args = self.inputs(device, dtype)
        here = self.kernel(args)
        there = self.kernel(
            [a.to(other) if hasattr(a, "to") and hasattr(a, "device") else a for a in args]
        )
        for i, o in enumerate(there.outputs):
            if o.device != other:
                msg = f"{self.spec.name}: output {i} is on {o.device}, its inputs on {other}"
                attach("wrong-device", msg, op=self.spec.name, hint=ALLOC_HINT)
                raise AssertionError(msg)
        there = Step(
            [o.to(device) for o in there.outputs],
            {i: None if g is None else g.to(device) for i, g in there.grads.items()},
        )
        if self.spec.deterministic:
            bad = _differences(here, there)
        else:
            name = str(dtype).removeprefix("torch.")
            bad = [
                str(err)
                for err in _close_all(here, there, self.spec.rtol[name], self.spec.atol[name])
            ]
        if bad:
            msg = (
                f"{self.spec.name}: cross-device disagreement: the same input gave other "
                f"results on {other} than on {device} ({'; '.join(bad)})"
            )
            attach(
                "numerics",
                msg,
                op=self.spec.name,
                hint="a result that depends on the GPU it ran on: uninitialized memory, "
                "races, or a launch configuration taken from another device",
            )
            raise AssertionError(msg)

    def memory(self, device: Any, other: Any, dtype: Any) -> None:
        import torch

        if device.type != "cuda":
            pytest.skip("the memory check reads torch's CUDA caching allocator")
        args = self.inputs(device, dtype)
        self.kernel(args)  # warm-up: workspaces the op caches on first use
        gc.collect()
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        peaks, kept = [], []
        for _ in range(self.spec.repeats):
            torch.cuda.reset_peak_memory_stats(device)
            self.kernel(args)
            gc.collect()
            torch.cuda.synchronize(device)
            peaks.append(torch.cuda.max_memory_allocated(device) - base)
            kept.append(torch.cuda.memory_allocated(device) - base)
        evidence = (
            f"bytes above the inputs after each of {self.spec.repeats} forward"
            f"{' and backward' if self.diff_positions(args) else ''} calls: {kept}; "
            f"peak of each call: {peaks} (torch caching allocator, {device})"
        )
        problems = []
        if kept[-1] > 0:
            problems.append(
                f"{kept[-1]} bytes stay allocated after {self.spec.repeats} calls "
                f"whose results were dropped"
            )
        if peaks[-1] > peaks[0]:
            problems.append(
                f"the peak grew from {peaks[0]} to {peaks[-1]} bytes over "
                f"{self.spec.repeats} identical calls"
            )
        if problems:
            msg = f"{self.spec.name}: {'; '.join(problems)}"
            attach(
                "memory-leak",
                msg,
                op=self.spec.name,
                evidence=evidence,
                hint="something keeps a reference to a tensor of every call (a global "
                "cache, a saved tensor that outlives the graph)",
            )
            raise AssertionError(f"{msg}\n{evidence}")

    def dtypes(self, device: Any) -> None:
        import torch

        def make(dtype: Any) -> tuple[Any, ...]:
            return self.inputs(device, dtype)

        with torch.no_grad():
            testing.check_dtypes(
                lambda *a: call_op(self.spec, a), make, self.spec.dtypes, what=self.spec.name
            )

    def opcheck(self, device: Any) -> None:
        import torch

        dtype = getattr(torch, "float32" if "float32" in self.spec.dtypes else self.spec.dtypes[0])
        args = list(self.inputs(device, dtype))
        for i in self.diff_positions(args):
            args[i] = args[i].detach().requires_grad_()
        torch.library.opcheck(self.spec.op, tuple(args))

    def gradcheck(self, device: Any) -> None:
        import torch
        from torch.autograd.gradcheck import GradcheckError

        args = list(self.inputs(device, torch.float64))
        positions = self.diff_positions(args)
        for i in positions:
            args[i] = args[i].detach().requires_grad_()

        def fn(*diff: Any) -> Any:
            full = list(args)
            for i, d in zip(positions, diff, strict=True):
                full[i] = d
            return tuple(flat_tensors(call_op(self.spec, full)))

        try:
            torch.autograd.gradcheck(fn, tuple(args[i] for i in positions), fast_mode=True)
        except GradcheckError as err:
            head = " ".join(str(err).split("\n")[:3])
            msg = f"{self.spec.name}: float64 gradcheck failed: {head}"
            attach(
                "numerics",
                msg,
                op=self.spec.name,
                evidence=str(err)[:4000],
                hint="the backward does not match finite differences of the forward",
            )
            raise AssertionError(msg) from None


def _current_device() -> int | None:
    """The current CUDA device, or None where CUDA is not initialized (never initializes)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.current_device())


def _max_err(a: Any, b: Any) -> float:
    """Largest absolute difference, in float64 on ``b``'s device (NaN-free inputs)."""
    import torch

    if a.numel() == 0:
        return 0.0
    return float((a.detach().to(b.device, torch.float64) - b.to(torch.float64)).abs().max())


def _differences(a: Step, b: Step) -> list[str]:
    """Which outputs / gradients of two steps differ in any bit."""
    import torch

    bad = []
    pairs = [
        (f"output {i}", x, y) for i, (x, y) in enumerate(zip(a.outputs, b.outputs, strict=True))
    ]
    pairs += [(f"gradient of argument {i}", a.grads[i], b.grads.get(i)) for i in sorted(a.grads)]
    for what, x, y in pairs:
        if x is None or y is None:
            continue
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(_bits(x), _bits(y)):
            ne = int((x != y).sum()) if x.shape == y.shape else x.numel()
            bad.append(
                f"{what}: {ne} of {x.numel()} elements, max abs difference {_max_err(x, y):.3g}"
            )
    return bad


def _bits(t: Any) -> Any:
    """The bytes of a tensor (NaNs compare equal to themselves)."""
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _close_all(a: Step, b: Step, rtol: float, atol: float) -> list[AssertionError]:
    errors = []
    pairs = list(zip(a.outputs, b.outputs, strict=True))
    pairs += [(a.grads[i], b.grads.get(i)) for i in sorted(a.grads)]
    for x, y in pairs:
        if x is None or y is None:
            continue
        try:
            testing.assert_close(x, y, rtol=rtol, atol=atol, what="on the other device")
        except AssertionError as err:
            errors.append(err)
    return errors


def _cuda_error(spec: OpSpec, err: BaseException, other: Any) -> None:
    """A CUDA error while another device is current: most often a missing device guard
    (``gpucheck run`` confirms it by re-running the case with its own device current)."""
    text = str(err)
    if not any(m in text for m in CUDA_ERROR_MARKERS):
        return
    attach(
        "cuda-error",
        f"{spec.name}: {text.splitlines()[0]}",
        op=spec.name,
        hint="with another device current, an illegal address is the classic missing "
        "device guard (`const at::cuda::OptionalCUDAGuard guard(device_of(x));`)"
        if other is not None
        else None,
    )
