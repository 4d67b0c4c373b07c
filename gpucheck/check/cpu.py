"""``check_op`` without a GPU: a dry run of the suite itself.

Where no CUDA device is visible (``gpucheck run --cpu-only``, ``pytest`` on a laptop), the cases
of a :func:`gpucheck.check_op` battery do not all skip: the suite's own parts are checked on
CPU, so that a wrong ``make_inputs``, ``reference`` or tolerance is found before GPU time is
spent on it. The op itself is never called (it is a CUDA kernel):

- ``devices-<dtype>``: ``make_inputs(cpu, dtype)`` gives tensors on the device asked for,
  floating ones in the dtype asked for, finite and not all zeros;
- ``numerics-<dtype>``: the reference runs on those inputs in float64 (forward, and backward
  when gradients are checked), gives finite outputs, the same bits when called twice, the
  same output shapes when run in ``dtype``; in float32 / float64 its own error (run in
  ``dtype`` against float64) fits the check's ``rtol`` / ``atol``, or no kernel could pass,
  and, run in float64, it is as accurate as ``dtype`` asks: compared with itself computed in
  float64 throughout (its casts to precisions below ``dtype``, a ``x.float()`` inside, kept in
  float64: :func:`lowered`), it is within ``rtol`` / ``atol``, or a correct ``dtype`` kernel
  fails against it;
- every other check waits for a GPU (skipped, saying so).

A failure names the user's function and the line of the user's file it points at.
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from gpucheck import testing
from gpucheck.check.runner import LOW_PRECISION, Runner, Step
from gpucheck.check.spec import OpSpec

#: floating dtypes by precision, finest first, and their mantissa bits
MANTISSA = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}

#: the reason every check that needs the op on a GPU is skipped with (one reason: the run's
#: summary counts them together)
WAITS = (
    "waits for a GPU: this check runs the op on a CUDA device (the suite's own inputs "
    "and reference were checked on CPU)"
)


def where(fn: Callable[..., Any], err: BaseException | None = None) -> str:
    """``path:line`` in the user's file: the innermost frame of ``err`` in the file that
    defines ``fn``, else the line ``fn`` is defined at (relative to the current folder)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    try:
        path = inspect.getsourcefile(fn) or (code.co_filename if code else None)
    except TypeError:  # a builtin, a C function
        path = None
    line = code.co_firstlineno if code else None
    if err is not None and path is not None:
        mine = [
            f
            for f in traceback.extract_tb(err.__traceback__)
            if os.path.realpath(f.filename) == os.path.realpath(path)
        ]
        if mine:
            line = mine[-1].lineno
    if path is None:
        return repr(fn)
    try:
        shown = os.path.relpath(path)
        path = path if shown.startswith("..") else shown
    except ValueError:
        pass
    return f"{path}:{line}" if line else path


def dry_run(spec: OpSpec, case: str, seed: int) -> None:
    """The CPU form of the case ``case`` of ``spec`` (see the module's docstring)."""
    import torch

    check, _, dtype_name = case.partition("-")
    if check not in ("devices", "numerics"):
        pytest.skip(WAITS)
    dtype = getattr(torch, dtype_name)
    cpu = torch.device("cpu")
    runner = Runner(spec, seed)
    args = _inputs(spec, runner, cpu, dtype, dtype_name)
    if check == "numerics":
        _reference(spec, runner, args, dtype, dtype_name)


def _inputs(spec: OpSpec, runner: Runner, device: Any, dtype: Any, name: str) -> tuple[Any, ...]:
    import torch

    made_by = f"make_inputs ({where(spec.make_inputs)})"
    try:
        args = runner.inputs(device, dtype)
    except Exception as err:
        raise AssertionError(
            f"{spec.name}: make_inputs(cpu, {name}) raised "
            f"{type(err).__name__}: {err} at {where(spec.make_inputs, err)}"
        ) from None
    problems = []
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            continue
        if a.device != device:
            problems.append(
                f"argument {i} is on {a.device}, not on the device asked for "
                f"({device}): make it with device=device"
            )
        if a.is_floating_point() and a.dtype != dtype:
            problems.append(
                f"argument {i} is {str(a.dtype).removeprefix('torch.')}, not the "
                f"dtype asked for ({name}): make it with dtype=dtype"
            )
        if a.is_floating_point() and a.numel():
            if not bool(torch.isfinite(a).all()):
                problems.append(f"argument {i} holds NaN or inf")
            elif not bool(a.any()):
                problems.append(f"argument {i} is all zeros: a kernel that ignores it passes")
    if problems:
        raise AssertionError(
            f"{spec.name}: {made_by}, asked for (cpu, {name}): " + "; ".join(problems)
        )
    return args


def _reference(spec: OpSpec, runner: Runner, args: tuple[Any, ...], dtype: Any, name: str) -> None:
    import torch

    reference = spec.reference
    if reference is None:
        return
    at = where(reference)

    def run(upcast: Any, what: str) -> Step:
        try:
            return runner.step(lambda a: reference(*a), args, upcast=upcast)
        except AssertionError as err:  # no output requires grad
            raise AssertionError(
                f"{spec.name}: the reference ({at}), run {what}, gives no "
                "output that requires grad: compute it with differentiable "
                "torch operations, or pass backward=False"
            ) from err
        except Exception as err:
            raise AssertionError(
                f"{spec.name}: the reference, run {what}, raised "
                f"{type(err).__name__}: {err} at {where(reference, err)}"
            ) from None

    want = run(torch.float64, "in float64")
    tensors = [*want.outputs, *(g for g in want.grads.values() if g is not None)]
    if not want.outputs:
        raise AssertionError(f"{spec.name}: the reference ({at}) returns no tensor")
    if any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors):
        raise AssertionError(
            f"{spec.name}: the reference ({at}) gives NaN or inf in float64 "
            f"on the inputs of make_inputs(cpu, {name})"
        )
    again = run(torch.float64, "in float64 a second time")
    if any(not torch.equal(a, b) for a, b in zip(want.outputs, again.outputs, strict=False)):
        raise AssertionError(
            f"{spec.name}: the reference ({at}) gives other results when "
            "called twice on the same input: it must be a function of its "
            "inputs (no random numbers)"
        )
    own = run(None, f"in {name}")
    shapes = [tuple(t.shape) for t in want.outputs]
    if [tuple(t.shape) for t in own.outputs] != shapes:
        raise AssertionError(
            f"{spec.name}: the reference ({at}) gives outputs of shapes "
            f"{[tuple(t.shape) for t in own.outputs]} in {name} but {shapes} "
            "in float64"
        )
    if name in LOW_PRECISION:
        return  # judged against its own error in that dtype: fits by construction
    rtol, atol = spec.rtol[name], spec.atol[name]
    for i, (g, w) in enumerate(zip(own.outputs, want.outputs, strict=True)):
        if not g.is_floating_point():
            continue
        m = testing.measure(g, w, rtol=rtol, atol=atol, what=f"output {i}")
        if not m.ok:  # not recorded as a measurement of the op: the op did not run
            first = m.message().splitlines()[0]
            raise AssertionError(
                f"{spec.name}: the reference ({at}) itself, run in {name}, is off from its "
                f"float64 result by more than rtol={rtol:g}, atol={atol:g} ({first}): no "
                f"{name} kernel can pass numerics-{name}; loosen rtol/atol for {name}"
            )
    _as_accurate_as(spec, args, want.outputs, name)


def _as_accurate_as(spec: OpSpec, args: tuple[Any, ...], want: list[Any], name: str) -> None:
    """The reference run in float64 (``want``) against itself computed in float64
    throughout (:func:`lowered`), within ``name``'s tolerances."""
    reference = spec.reference
    assert reference is not None
    kept = lowered(lambda a: reference(*a), args, name)
    if kept is None:
        return
    lower, full = kept
    rtol, atol = spec.rtol[name], spec.atol[name]
    for i, (g, w) in enumerate(zip(want, full, strict=True)):
        if not g.is_floating_point():
            continue
        m = testing.measure(g, w, rtol=rtol, atol=atol, what=f"output {i}")
        if not m.ok:
            raise AssertionError(
                f"{spec.name}: the reference ({where(reference)}), run in float64, computes "
                f"in {lower} inside, so it is only {lower}-accurate (off from itself computed "
                f"in float64 by more than rtol={rtol:g}, atol={atol:g}: "
                f"{m.message().splitlines()[0]}) and a correct {name} kernel fails "
                f"numerics-{name} against it: compute in the inputs' dtype where it is {name} "
                "(e.g. x.to(torch.promote_types(x.dtype, torch.float32)), not x.float())"
            )


def lowered(
    fn: Callable[[list[Any]], Any], args: tuple[Any, ...], name: str
) -> tuple[str, list[Any]] | None:
    """``fn`` on ``args`` upcast to float64, computed in float64 throughout: every cast to a
    floating dtype below ``name`` (``.float()``, ``.to(torch.float16)``, ``dtype=`` of a
    factory or a reduction) kept in float64. Returns the lowest dtype it cast to and its
    floating outputs so computed; None where it casts to none, or cannot be computed so."""
    import torch
    from torch.overrides import TorchFunctionMode

    from gpucheck.check.runner import flat_tensors

    below = {getattr(torch, n): n for n, bits in MANTISSA.items() if bits < MANTISSA[name]}
    casts: dict[Any, Any] = {
        torch.Tensor.float: torch.float32,
        torch.Tensor.half: torch.float16,
        torch.Tensor.bfloat16: torch.bfloat16,
    }
    seen: list[Any] = []

    class KeepFloat64(TorchFunctionMode):
        def __torch_function__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            if func in casts and casts[func] in below:
                seen.append(casts[func])
                return args[0].to(torch.float64)
            seen.extend(a for a in (*args, *(kwargs or {}).values()) if lower(a))
            args = tuple(torch.float64 if lower(a) else a for a in args)
            kwargs = {k: torch.float64 if lower(v) else v for k, v in (kwargs or {}).items()}
            return func(*args, **kwargs)

    def lower(value: Any) -> bool:
        return isinstance(value, torch.dtype) and value in below

    upcast = [
        a.detach().to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in args
    ]
    try:
        with torch.no_grad(), KeepFloat64():
            out = [t for t in flat_tensors(fn(upcast)) if t.is_floating_point()]
    except Exception:  # it cannot be computed so (an op of that dtype only): no judgement
        return None
    if not seen:
        return None
    return below[min(seen, key=lambda d: MANTISSA[below[d]])], out
