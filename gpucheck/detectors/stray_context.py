"""stray-context: a worker that should touch one GPU holds memory (a CUDA context) on another.

In the passes that run each case with its target current and no other device initialized
(``|target-current``, ``|rerun:target-current``), the worker's NVML sampler sees this
process's memory on every GPU. Memory on a GPU other than the target means something in the
case created a context there: a kernel launched, memory allocated or ``cudaSetDevice`` called
on the wrong device — the trace a missing or wrong device guard leaves even when nothing
crashes. Contexts live as long as the process, so the finding goes to the first case of a
worker where the other GPU appears (the record's ``memory.nvml_peak_other_devices``).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpucheck.detectors.base import BaseDetector
from gpucheck.model.kinds import Kind
from gpucheck.model.modes import try_parse
from gpucheck.model.results import CaseRecord, Finding

HINT = (
    "guard every entry point of the extension on its inputs' device "
    "(`const at::cuda::OptionalCUDAGuard guard(device_of(x));`) and allocate with "
    "`x.options()`; if the test itself uses the other GPU on purpose, this is expected"
)


def stray(records: Iterable[CaseRecord], names: dict[str, str] | None = None) -> list[Finding]:
    """Findings for the cases where a target-current worker first held memory on another GPU
    (``names``: GPU UUID -> "cuda:N" from the run header)."""
    names = names or {}
    before: dict[tuple[str, str], set[str]] = {}
    found = []
    for r in records:
        mode = r.mode
        parsed = try_parse(mode)
        if parsed is None or not parsed.target_current:
            continue
        key = (r.device, mode)
        other = r.memory.other_devices  # a crashed case has no NVML sample
        new = sorted(set(other) - before.get(key, set()))
        before[key] = set(other)  # a new worker starts with none: what it gains is new again
        if not new:
            continue
        where = ", ".join(f"{names.get(u, u)} ({other[u] / 2**20:.0f} MiB)" for u in new)
        found.append(
            r.info.finding(
                "stray-context",
                "warning",
                f"with only {r.device} in use, the worker created a CUDA context on "
                f"{', '.join(names.get(u, u) for u in new)} during this case",
                evidence=f"NVML: this worker's memory on other GPUs at the end of the case: "
                f"{where} "
                f"({mode}: the target current, no other device initialized)",
                hint=HINT,
            )
        )
    return found


#: a worker's process held memory on a GPU it was not started for
STRAY_CONTEXT = Kind("stray-context", precedence=50)


class StrayContext(BaseDetector):
    """Parent side, over the records of the target-current passes."""

    name = "stray-context"
    kinds = (STRAY_CONTEXT,)

    def __init__(self, names: dict[str, str] | None = None) -> None:
        self.names = names or {}

    def run_finished(self, records: list[CaseRecord]) -> list[Finding]:
        return stray(records, self.names)
