"""gpucheck: find the bugs of PyTorch CUDA extensions that only show on the second GPU,
inside backward, under mixed precision or after a checkpoint resume.

``gpucheck.check_op(op, make_inputs, reference, dtypes=...)``: the standard battery on one op
of your extension as pytest cases (:mod:`gpucheck.check`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from gpucheck.errors import MemoryAnomalyError

__all__ = ["MemoryAnomalyError", "__version__", "check_op"]

if TYPE_CHECKING:
    # lazy: the API's top names it for type checkers; imported on first use (below)
    from gpucheck.check import check_op
else:

    def __getattr__(name: str) -> Any:
        if name == "check_op":
            # lazy: the API's top names it; on first use, so `import gpucheck` stays cheap
            from gpucheck.check import check_op

            return check_op
        raise AttributeError(f"module 'gpucheck' has no attribute {name!r}")
