"""``gpucheck.check_op``: the standard battery on one op of your extension, as pytest cases.

In a test file of your own::

    import gpucheck, torch, my_ext

    def make_inputs(device, dtype):                   # fresh random inputs, any sizes
        return (torch.randn(4, 113, 67, device=device, dtype=dtype),)

    def reference(x):                                 # pure PyTorch, any device and dtype
        return x.cumsum(1)

    test_my_op = gpucheck.check_op(torch.ops.my_ext.my_op, make_inputs, reference,
                                   dtypes=("float32", "bfloat16"))

``test_my_op`` is one parametrized test: a case per target device (the ``gpu_device``
fixture: another device current and initialized, a non-default stream current on the target)
and per check:

- ``devices-<dtype>``: outputs on the inputs' device, gradients on their inputs' devices, the
  caller's current device unchanged by forward and backward (``wrong-device``,
  ``device-state-leak``);
- ``numerics-<dtype>``: outputs and gradients against ``reference`` computed in float64
  (:func:`gpucheck.testing.assert_close`, per-dtype ``rtol`` / ``atol``); float16 and bfloat16
  are judged against the reference's own error in that dtype: the kernel's error must be
  within ``low_precision_factor`` (2) times the error of ``reference`` run in that dtype,
  plus ``atol``;
- ``determinism-<dtype>``: ``repeats`` calls on the same input give the same bits;
- ``cross_device-<dtype>`` (``multigpu``): the same input on another GPU gives the same bits;
- ``memory-<dtype>``: nothing stays allocated after ``repeats`` forward and backward calls,
  and the peak does not grow (torch's caching allocator);
- ``dtypes``: every claimed dtype works, every other floating dtype is refused with an error
  naming it (:func:`gpucheck.testing.check_dtypes`);
- ``opcheck``: ``torch.library.opcheck`` (ops registered with ``TORCH_LIBRARY`` only);
- ``gradcheck``: an fp64 ``torch.autograd.gradcheck`` (when float64 is claimed).

It works for ``torch.ops.*`` ops and for plain functions (a pybind11 module's, or the Python
wrapper around one): calls of a plain function are shown to gpucheck's op watch under its
name, so the worker-side detectors (profiler kernel device and stream, fingerprints) see them
as they see torch ops, and the checks above do not depend on them. Findings go into the case
record under ``gpucheck run`` and into the terminal summary under plain pytest
(:mod:`gpucheck.pytest_plugin`).

Inputs are made with ``torch.manual_seed(seed)``: one seed per run (``gpucheck run``) or
session (``pytest -n``; the same on every xdist worker), fresh each time, or
``$GPUCHECK_SEED``; a failing case prints its seed.
"""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpucheck import testing
from gpucheck.errors import CUDA_ERROR_MARKERS
from gpucheck.worker.case import attach, set_case_op

FLOAT_DTYPES = testing.FLOAT_DTYPES
LOW_PRECISION = ("float16", "bfloat16")
#: (rtol, atol) by dtype where none is given: torch.testing.assert_close's defaults
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7), "float32": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5),
}
#: checks made once per claimed dtype, and once per op
PER_DTYPE = ("devices", "numerics", "determinism", "cross_device", "memory")
PER_OP = ("dtypes", "opcheck", "gradcheck")
SEED_ENV = "GPUCHECK_SEED"
ALLOC_HINT = ("allocate outputs and gradients with the input's options "
              "(`at::empty(sizes, x.options())`), not `torch::kCUDA` / `device=\"cuda\"` "
              "(the current device), and guard every entry point with "
              "`const at::cuda::OptionalCUDAGuard guard(device_of(x));`")
LEAK_HINT = ("use a scoped guard, which restores the caller's device on return "
             "(`const at::cuda::OptionalCUDAGuard guard(device_of(x));`), not a bare "
             "`cudaSetDevice`")
#: the autograd engine's complaint about a gradient on another device than its input
_ENGINE_DEVICE = re.compile(r"invalid gradient at index (\d+) - expected device (\S+) but got "
                            r"(\S+)")


_NO_GRAD = ("{name}: backward was asked for, but no output requires grad (no autograd "
            "registered?); pass backward=False to check_op if the op has none")


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


def _per_dtype(value: float | Mapping[str, float] | None, which: int) -> dict[str, float]:
    out = {d: tol[which] for d, tol in DEFAULT_TOLERANCES.items()}
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(FLOAT_DTYPES))
        if unknown:
            raise ValueError(f"check_op: tolerances for unknown dtype(s) {unknown}; "
                             f"known: {', '.join(FLOAT_DTYPES)}")
        out.update({k: float(v) for k, v in value.items()})
    elif value is not None:
        out = dict.fromkeys(out, float(value))
    return out


def check_op(op: Any, make_inputs: Callable[..., Any],
             reference: Callable[..., Any] | None = None, *,
             dtypes: Sequence[str] = ("float32",), backward: bool | Sequence[int] = True,
             devices: str | Sequence[int] = "all", repeats: int = 3,
             atol: float | Mapping[str, float] | None = None,
             rtol: float | Mapping[str, float] | None = None,
             low_precision_factor: float = 2.0, deterministic: bool = True,
             name: str | None = None, checks: Sequence[str] | None = None) -> Any:
    """The standard battery on ``op`` as one parametrized pytest test (assign it to a
    module-level name starting with ``test``).

    Args:
        op: ``torch.ops.<ns>.<op>``, or any callable (a pybind11 function, a Python wrapper
            with its autograd): called as ``op(*make_inputs(device, dtype))``.
        make_inputs: ``(device, dtype) -> tuple`` of arguments; tensors on ``device``,
            floating ones in ``dtype``. Called after ``torch.manual_seed``: use torch's
            random functions. Non-tile-multiple sizes are a good idea.
        reference: a pure-PyTorch twin of ``op`` (same arguments, same outputs), run on the
            target device in float64 (and in each low-precision dtype, for its own error).
            None: no ``numerics`` cases.
        dtypes: the floating dtypes ``op`` claims (names: ``"float32"``, ``"bfloat16"``...).
        backward: check gradients of every floating tensor argument (True), of those at
            the given argument positions, or none (False).
        devices: ``"all"`` target devices, or the CUDA indices to check (others are skipped).
        repeats: calls per determinism and memory check.
        atol, rtol: tolerance for every dtype, or by dtype name (the others keep
            ``torch.testing``'s defaults). For float16 / bfloat16, ``atol`` is added to the
            allowance derived from the reference's own error.
        low_precision_factor: how many times the reference's own error in float16 / bfloat16
            the kernel may be off (flash-attention's rule: 2).
        deterministic: False for ops that are not bitwise repeatable by design (the
            determinism case is skipped, the cross-device one compares within tolerance).
        name: the op's name in findings (default: ``ns::op``, or ``module.function``).
        checks: a subset of :data:`PER_DTYPE` and :data:`PER_OP` (default: all that apply).

    Returns:
        The test function (parametrized over the checks; the devices come from the
        ``gpu_device`` fixture of gpucheck's pytest plugin).
    """
    torch_op = is_torch_op(op)
    spec = OpSpec(
        op=op, name=name or op_name(op), make_inputs=make_inputs, reference=reference,
        dtypes=_dtypes(dtypes), backward=(backward if isinstance(backward, bool)
                                          else tuple(int(i) for i in backward)),
        devices=None if devices == "all" else _devices(devices), repeats=int(repeats),
        rtol=_per_dtype(rtol, 0), atol=_per_dtype(atol, 1),
        low_precision_factor=float(low_precision_factor), deterministic=deterministic,
        torch_op=torch_op)
    if spec.repeats < 2:
        raise ValueError(f"check_op: repeats must be at least 2, got {repeats}")
    if not callable(op):
        raise TypeError(f"check_op: op must be callable (a torch op or a function), got {op!r}")
    if not callable(make_inputs):
        raise TypeError("check_op: make_inputs must be callable as make_inputs(device, dtype)")
    chosen = _checks(spec, checks)
    spec = OpSpec(**{**spec.__dict__, "checks": chosen})
    params = [pytest.param(c, id=c, marks=_marks(c)) for c in chosen]

    def test(gpu_device: Any, other_device: Any, gpucheck_check: str,
             request: pytest.FixtureRequest) -> None:
        seed = case_seed(request.config)
        request.node.user_properties.append(("gpucheck_seed", seed))
        run_check(spec, gpucheck_check, gpu_device, other_device, seed)

    test.__doc__ = f"gpucheck.check_op battery of {spec.name}"
    test.gpucheck_op = spec  # type: ignore[attr-defined]
    test = pytest.mark.gpu(test)
    return pytest.mark.parametrize("gpucheck_check", params)(test)


def _dtypes(dtypes: Sequence[str]) -> tuple[str, ...]:
    if isinstance(dtypes, str):
        dtypes = (dtypes,)
    names = tuple(str(d).removeprefix("torch.") for d in dtypes)
    unknown = [d for d in names if d not in FLOAT_DTYPES]
    if unknown or not names:
        raise ValueError(f"check_op: dtypes must name floating dtypes among "
                         f"{', '.join(FLOAT_DTYPES)}; got {list(dtypes)}")
    return names


def _devices(devices: str | Sequence[int]) -> tuple[int, ...]:
    if isinstance(devices, str):
        raise ValueError(f"check_op: devices must be 'all' or CUDA indices, got {devices!r}")
    return tuple(int(d) for d in devices)


def _checks(spec: OpSpec, checks: Sequence[str] | None) -> tuple[str, ...]:
    """The case ids of ``spec``: ``<check>-<dtype>`` for the per-dtype checks, then the
    per-op ones that apply."""
    known = (*PER_DTYPE, *PER_OP)
    wanted = known if checks is None else tuple(checks)
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        raise ValueError(f"check_op: unknown check(s) {unknown}; known: {', '.join(known)}")
    out = []
    for dtype in spec.dtypes:
        for c in PER_DTYPE:
            if c not in wanted or (c == "numerics" and spec.reference is None):
                continue
            out.append(f"{c}-{dtype}")
    if "dtypes" in wanted:
        out.append("dtypes")
    if "opcheck" in wanted and spec.torch_op:
        out.append("opcheck")
    if "gradcheck" in wanted and "float64" in spec.dtypes and spec.backward is not False:
        out.append("gradcheck")
    return tuple(out)


def _marks(case: str) -> list[Any]:
    check = case.split("-", 1)[0]
    if check == "cross_device":
        return [pytest.mark.multigpu]
    if check in ("devices", "numerics", "opcheck"):  # one call each: fit for the sanitizer
        return [pytest.mark.sanitizer]
    return []


# --- running one case ---------------------------------------------------------------------


def run_check(spec: OpSpec, case: str, device: Any, other: Any, seed: int) -> None:
    """Run the case ``case`` (``<check>-<dtype>`` or a per-op check) of ``spec`` on
    ``device`` (a CUDA device; a CPU one runs every check but ``memory``), with ``other``
    current (or None)."""
    import torch

    if spec.devices is not None and device.index not in spec.devices:
        pytest.skip(f"check_op(devices={list(spec.devices)}) leaves {device} out")
    check, _, dtype_name = case.partition("-")
    set_case_op(spec.name)
    runner = _Runner(spec, seed)
    try:
        if check in PER_DTYPE:
            getattr(runner, check)(device, other, getattr(torch, dtype_name))
        else:
            getattr(runner, check)(device)
    except AssertionError as err:
        raise AssertionError(f"{err}\n(inputs seeded with {SEED_ENV}={seed})") from None


def case_seed(config: pytest.Config) -> int:
    """The seed of this run: ``$GPUCHECK_SEED``, else one drawn per run and shared by every
    worker of it (from the harness's run id or xdist's test run uid)."""
    import zlib

    if os.environ.get(SEED_ENV):
        return int(os.environ[SEED_ENV])
    run_id = getattr(config.option, "gpucheck_run_id", None)
    shared = (run_id if run_id and run_id != "adhoc"
              else os.environ.get("PYTEST_XDIST_TESTRUNUID"))
    if shared:
        return zlib.crc32(shared.encode()) & 0x7FFFFFFF
    if not hasattr(config, "_gpucheck_seed"):
        config._gpucheck_seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF  # type: ignore[attr-defined]
    return int(config._gpucheck_seed)  # type: ignore[attr-defined]


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


@dataclass
class Step:
    """One forward (and backward) call: outputs, gradients by argument position."""

    outputs: list[Any]
    grads: dict[int, Any]


class _Runner:
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
        floating = [i for i, a in enumerate(args)
                    if isinstance(a, torch.Tensor) and a.is_floating_point()]
        if self.spec.backward is True:
            return floating
        return [i for i in self.spec.backward if i in floating]

    def step(self, fn: Callable[[Sequence[Any]], Any], args: Sequence[Any],
             grad_seed: int | None = None, upcast: Any = None) -> Step:
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
        gouts = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device, o.dtype)
                 for o in diff]
        grads = torch.autograd.grad(diff, [args[i] for i in positions], gouts,
                                    allow_unused=True)
        return Step([o.detach() for o in outputs],
                    {i: None if g is None else g.detach() for i, g in zip(positions, grads,
                                                                          strict=True)})

    def kernel(self, args: Sequence[Any]) -> Step:
        return self.step(lambda a: call_op(self.spec, a), args)

    # --- checks ---

    def devices(self, device: Any, other: Any, dtype: Any) -> None:
        import torch

        args = self.inputs(device, dtype)
        problems: list[tuple[str, str, str]] = []  # (kind, message, hint)
        before = _current_device()
        positions = self.diff_positions(args)
        step_args = [a.detach().clone().requires_grad_() if i in positions else a
                     for i, a in enumerate(args)]
        with torch.enable_grad():
            try:
                out = call_op(self.spec, step_args)
            except RuntimeError as err:
                _cuda_error(self.spec, err, other)
                raise
        after_forward = _current_device()
        outputs = flat_tensors(out)
        for i, o in enumerate(outputs):
            if o.device != device:
                problems.append(("wrong-device", f"{self.spec.name}: output {i} is on "
                                 f"{o.device}, its inputs on {device}", ALLOC_HINT))
        if after_forward != before:
            problems.append(("device-state-leak", f"{self.spec.name}: forward changed the "
                             f"current device from cuda:{before} to cuda:{after_forward}",
                             LEAK_HINT))
            torch.cuda.set_device(before)
        diff = [o for o in outputs if o.requires_grad]
        if positions and not diff:
            raise AssertionError(_NO_GRAD.format(name=self.spec.name))
        if positions and diff:
            gouts = [torch.ones_like(o) for o in diff]
            try:
                grads = torch.autograd.grad(diff, [step_args[i] for i in positions], gouts,
                                            allow_unused=True)
            except RuntimeError as err:
                m = _ENGINE_DEVICE.search(str(err))
                if m is None:
                    _cuda_error(self.spec, err, other)
                    raise
                grads = ()
                problems.append(("wrong-device", f"{self.spec.name}: backward returned the "
                                 f"gradient {m.group(1)} on {m.group(3)}, its input is on "
                                 f"{m.group(2)} (the autograd engine refused it)", ALLOC_HINT))
            for i, g in zip(positions, grads, strict=False):
                if g is not None and g.device != step_args[i].device:
                    problems.append(("wrong-device", f"{self.spec.name}: the gradient of "
                                     f"argument {i} is on {g.device}, the argument on "
                                     f"{step_args[i].device}", ALLOC_HINT))
            after_backward = _current_device()
            if after_backward != before:
                problems.append(("device-state-leak", f"{self.spec.name}: backward changed "
                                 f"the current device from cuda:{before} to "
                                 f"cuda:{after_backward}", LEAK_HINT))
                torch.cuda.set_device(before)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        for kind, message, hint in problems:
            attach(kind, message, op=self.spec.name,
                   severity="warning" if kind == "device-state-leak" else "error", hint=hint,
                   evidence=f"target {device}, current device before the call cuda:{before}"
                            + (f" (another device, {other}, was made current)" if other
                               else " (the only visible device)"))
        if problems:
            raise AssertionError("; ".join(m for _, m, _ in problems))

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
                    failures.append(f"{what}: {'no' if g is None else 'a'} gradient where the "
                                    f"reference has {'one' if g is None else 'none'}")
                continue
            if b is None:
                rtol, atol = self.spec.rtol[name], self.spec.atol[name]
                label = f"{self.spec.name} {what} {name} vs float64 reference"
            else:
                own = max(_max_err(b, w), _max_err(w.to(dtype), w))
                rtol = 0.0
                atol = self.spec.low_precision_factor * own + self.spec.atol[name]
                label = (f"{self.spec.name} {what} {name} vs float64 reference (allowed: "
                         f"{self.spec.low_precision_factor:g} x the reference's own {name} "
                         f"error {own:.3g} + atol {self.spec.atol[name]:g})")
            try:
                testing.assert_close(g, w, rtol=rtol, atol=atol, what=label)
            except AssertionError as err:
                failures.append(str(err))
        if failures:
            for f in failures:
                attach("numerics", f"mismatch against the reference: {f}", op=self.spec.name,
                       hint="the kernel's result is off by more than the tolerance of this "
                            "check; in float16 / bfloat16 a kernel that accumulates in the "
                            "low precision (instead of float32) fails here")
            raise AssertionError("\n".join(failures))

    def _pairs(self, got: Step, want: Step, base: Step | None
               ) -> list[tuple[str, Any, Any, Any]]:
        if len(got.outputs) != len(want.outputs):
            raise AssertionError(f"{self.spec.name}: {len(got.outputs)} output tensor(s), the "
                                 f"reference gives {len(want.outputs)}")
        pairs = [(f"output {i}", g, w, None if base is None else base.outputs[i])
                 for i, (g, w) in enumerate(zip(got.outputs, want.outputs, strict=True))]
        pairs += [(f"gradient of argument {i}", got.grads[i], want.grads.get(i),
                   None if base is None else base.grads.get(i)) for i in sorted(got.grads)]
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
                msg = (f"{self.spec.name}: non-deterministic: call {n + 1} differs from call 1 "
                       f"on the same input ({'; '.join(bad)})")
                attach("numerics", msg, op=self.spec.name, hint="make the result a function "
                       "of the input alone (no float atomics whose order varies, no "
                       "uninitialized memory, no races), or pass deterministic=False")
                raise AssertionError(msg)

    def cross_device(self, device: Any, other: Any, dtype: Any) -> None:
        if other is None:
            pytest.skip("needs a second visible CUDA device")
        args = self.inputs(device, dtype)
        here = self.kernel(args)
        there = self.kernel([a.to(other) if hasattr(a, "to") and hasattr(a, "device") else a
                             for a in args])
        for i, o in enumerate(there.outputs):
            if o.device != other:
                msg = f"{self.spec.name}: output {i} is on {o.device}, its inputs on {other}"
                attach("wrong-device", msg, op=self.spec.name, hint=ALLOC_HINT)
                raise AssertionError(msg)
        there = Step([o.to(device) for o in there.outputs],
                     {i: None if g is None else g.to(device) for i, g in there.grads.items()})
        if self.spec.deterministic:
            bad = _differences(here, there)
        else:
            name = str(dtype).removeprefix("torch.")
            bad = [str(err) for err in _close_all(here, there, self.spec.rtol[name],
                                                  self.spec.atol[name])]
        if bad:
            msg = (f"{self.spec.name}: cross-device disagreement: the same input gave other "
                   f"results on {other} than on {device} ({'; '.join(bad)})")
            attach("numerics", msg, op=self.spec.name,
                   hint="a result that depends on the GPU it ran on: uninitialized memory, "
                        "races, or a launch configuration taken from another device")
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
        evidence = (f"bytes above the inputs after each of {self.spec.repeats} forward"
                    f"{' and backward' if self.diff_positions(args) else ''} calls: {kept}; "
                    f"peak of each call: {peaks} (torch caching allocator, {device})")
        problems = []
        if kept[-1] > 0:
            problems.append(f"{kept[-1]} bytes stay allocated after {self.spec.repeats} calls "
                            f"whose results were dropped")
        if peaks[-1] > peaks[0]:
            problems.append(f"the peak grew from {peaks[0]} to {peaks[-1]} bytes over "
                            f"{self.spec.repeats} identical calls")
        if problems:
            msg = f"{self.spec.name}: {'; '.join(problems)}"
            attach("memory-leak", msg, op=self.spec.name, evidence=evidence,
                   hint="something keeps a reference to a tensor of every call (a global "
                        "cache, a saved tensor that outlives the graph)")
            raise AssertionError(f"{msg}\n{evidence}")

    def dtypes(self, device: Any) -> None:
        import torch

        def make(dtype: Any) -> tuple[Any, ...]:
            return self.inputs(device, dtype)

        with torch.no_grad():
            testing.check_dtypes(lambda *a: call_op(self.spec, a), make, self.spec.dtypes,
                                 what=self.spec.name)

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
            attach("numerics", msg, op=self.spec.name, evidence=str(err)[:4000],
                   hint="the backward does not match finite differences of the forward")
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
    pairs = [(f"output {i}", x, y) for i, (x, y) in enumerate(zip(a.outputs, b.outputs,
                                                                  strict=True))]
    pairs += [(f"gradient of argument {i}", a.grads[i], b.grads.get(i)) for i in sorted(a.grads)]
    for what, x, y in pairs:
        if x is None or y is None:
            continue
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(_bits(x), _bits(y)):
            ne = int((x != y).sum()) if x.shape == y.shape else x.numel()
            bad.append(f"{what}: {ne} of {x.numel()} elements, max abs difference "
                       f"{_max_err(x, y):.3g}")
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
    attach("cuda-error", f"{spec.name}: {text.splitlines()[0]}", op=spec.name,
           hint="with another device current, an illegal address is the classic missing "
                "device guard (`const at::cuda::OptionalCUDAGuard guard(device_of(x));`)"
                if other is not None else None)
