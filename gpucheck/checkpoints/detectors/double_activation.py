"""double-activation: a checkpoint round trip in a case gave back activated parameters.

Worker side. Cases check their users' save/load code with
:func:`gpucheck.checkpoints.check_roundtrip`; each call is kept in
``gpucheck.checkpoints.roundtrip.OUTCOMES``. A failed one becomes a finding of the case: a
field that came back as its own activation (``exp`` of the log-scales, ``sigmoid`` of the
logits) is ``double-activation`` — the renderer will activate it again, and the render asks for
tens of GiB (``docs/failures.md``, failure 3) —; any other difference is
``checkpoint-roundtrip``. Costs nothing in cases that never call it (the module is not even
imported).
"""

from __future__ import annotations

import sys
from typing import Any

from gpucheck.detectors.base import BaseDetector, CaseInfo
from gpucheck.model.kinds import Kind
from gpucheck.model.results import Finding

__all__ = ["DoubleActivation"]

_MODULE = "gpucheck.checkpoints.roundtrip"
HINT = (
    "store raw parameters (log-scales, opacity logits, raw quaternions) and activate only "
    "where rendering does (gpucheck.checkpoints.activations); `gpucheck lint-checkpoint "
    "FILE` tells whether a file on disk is raw or activated"
)


def _outcomes() -> list[Any] | None:
    module = sys.modules.get(_MODULE)
    return None if module is None else module.OUTCOMES


#: a checkpoint stored activated, which a 3DGS loader activates again (wrong values from the
#: start: a root cause before what follows from them); a round trip that changed a checkpoint
DOUBLE_ACTIVATION = Kind("double-activation", precedence=60)
CHECKPOINT_ROUNDTRIP = Kind("checkpoint-roundtrip")


class DoubleActivation(BaseDetector):
    """Turns the failed checkpoint round trips of a case into findings."""

    name = "double-activation"
    kinds = (DOUBLE_ACTIVATION, CHECKPOINT_ROUNDTRIP)
    touches_gpu = False  # what it saw of the calls before an error stands

    def case_started(self, case: CaseInfo) -> None:
        kept = _outcomes()
        if kept:
            kept.clear()

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        kept = _outcomes()
        if not kept:
            return []
        reports, kept[:] = list(kept), []
        found = []
        for r in reports:
            if r.ok:
                continue
            fields = "; ".join(f"{k}: {v}" for k, v in r.fields.items())
            found.append(
                case.finding(
                    "double-activation" if r.activated else "checkpoint-roundtrip",
                    "error",
                    r.message.split("; ")[0] if r.activated else r.message,
                    evidence=f"{fields}\n{r.render or ''}".strip(),
                    hint=HINT if r.activated else "load(save(x)) must give back x exactly",
                )
            )
        return found
