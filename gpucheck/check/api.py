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

This module is the public API (``check_op``, ``run_check``, parametrisation); what a battery
was asked to check is :mod:`gpucheck.check.spec`, the checks themselves run in
:mod:`gpucheck.check.runner`, their CPU dry run in :mod:`gpucheck.check.cpu`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from gpucheck.check.cpu import dry_run
from gpucheck.check.runner import Runner
from gpucheck.check.spec import (
    DEFAULT_TOLERANCES,
    FLOAT_DTYPES,
    PER_DTYPE,
    PER_OP,
    SEED_ENV,
    OpSpec,
    is_torch_op,
    op_name,
)
from gpucheck.worker.case import set_case_op

__all__ = ["case_seed", "check_op", "run_check"]


def _per_dtype(value: float | Mapping[str, float] | None, which: int) -> dict[str, float]:
    out = {d: tol[which] for d, tol in DEFAULT_TOLERANCES.items()}
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(FLOAT_DTYPES))
        if unknown:
            raise ValueError(
                f"check_op: tolerances for unknown dtype(s) {unknown}; "
                f"known: {', '.join(FLOAT_DTYPES)}"
            )
        out.update({k: float(v) for k, v in value.items()})
    elif value is not None:
        out = dict.fromkeys(out, float(value))
    return out


def check_op(
    op: Any,
    make_inputs: Callable[..., Any],
    reference: Callable[..., Any] | None = None,
    *,
    dtypes: Sequence[str] = ("float32",),
    backward: bool | Sequence[int] = True,
    devices: str | Sequence[int] = "all",
    repeats: int = 3,
    atol: float | Mapping[str, float] | None = None,
    rtol: float | Mapping[str, float] | None = None,
    low_precision_factor: float = 2.0,
    deterministic: bool = True,
    name: str | None = None,
    checks: Sequence[str] | None = None,
) -> Any:
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
        op=op,
        name=name or op_name(op),
        make_inputs=make_inputs,
        reference=reference,
        dtypes=_dtypes(dtypes),
        backward=(backward if isinstance(backward, bool) else tuple(int(i) for i in backward)),
        devices=None if devices == "all" else _devices(devices),
        repeats=int(repeats),
        rtol=_per_dtype(rtol, 0),
        atol=_per_dtype(atol, 1),
        low_precision_factor=float(low_precision_factor),
        deterministic=deterministic,
        torch_op=torch_op,
    )
    if spec.repeats < 2:
        raise ValueError(f"check_op: repeats must be at least 2, got {repeats}")
    if not callable(op):
        raise TypeError(f"check_op: op must be callable (a torch op or a function), got {op!r}")
    if not callable(make_inputs):
        raise TypeError("check_op: make_inputs must be callable as make_inputs(device, dtype)")
    chosen = _checks(spec, checks)
    spec = OpSpec(**{**spec.__dict__, "checks": chosen})
    params = [pytest.param(c, id=c, marks=_marks(c)) for c in chosen]

    def test(
        gpu_device: Any, other_device: Any, gpucheck_check: str, request: pytest.FixtureRequest
    ) -> None:
        seed = case_seed(request.config)
        request.node.user_properties.append(("gpucheck_seed", seed))
        if gpu_device is None:  # no CUDA device visible: the suite's own parts, on CPU
            try:
                dry_run(spec, gpucheck_check, seed)
            except AssertionError as err:
                raise AssertionError(f"{err}\n(inputs seeded with {SEED_ENV}={seed})") from None
            return
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
        raise ValueError(
            f"check_op: dtypes must name floating dtypes among "
            f"{', '.join(FLOAT_DTYPES)}; got {list(dtypes)}"
        )
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
    runner = Runner(spec, seed)
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
    shared = run_id if run_id and run_id != "adhoc" else os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if shared:
        return zlib.crc32(shared.encode()) & 0x7FFFFFFF
    if not hasattr(config, "_gpucheck_seed"):
        config._gpucheck_seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF  # type: ignore[attr-defined]
    return int(config._gpucheck_seed)  # type: ignore[attr-defined]
