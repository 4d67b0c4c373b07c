"""``gpucheck.check_op``: the standard battery on one op of your extension, as pytest cases.

Three rooms, each below the next: :mod:`~gpucheck.check.spec` (what a battery is asked to
check), :mod:`~gpucheck.check.runner` (the checks, one method each),
:mod:`~gpucheck.check.cpu` (the dry run without a GPU) and :mod:`~gpucheck.check.api`
(``check_op`` and its parametrisation). Their public names are here.
"""

from __future__ import annotations

from gpucheck.check.api import case_seed, check_op, run_check
from gpucheck.check.cpu import dry_run
from gpucheck.check.runner import (
    ALLOC_HINT,
    LEAK_HINT,
    LOW_PRECISION,
    Runner,
    Step,
    call_op,
    flat_tensors,
)
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

__all__ = [
    "ALLOC_HINT",
    "DEFAULT_TOLERANCES",
    "FLOAT_DTYPES",
    "LEAK_HINT",
    "LOW_PRECISION",
    "PER_DTYPE",
    "PER_OP",
    "SEED_ENV",
    "OpSpec",
    "Runner",
    "Step",
    "call_op",
    "case_seed",
    "check_op",
    "dry_run",
    "flat_tensors",
    "is_torch_op",
    "op_name",
    "run_check",
]
