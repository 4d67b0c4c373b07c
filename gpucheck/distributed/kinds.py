"""The finding kinds of the distributed watchdog (:mod:`gpucheck.distributed.analysis`): each
names the rank at fault, a diagnosis. Its ``hang`` is the harness's kind
(:data:`gpucheck.model.kinds.HANG`), a diagnosis on a record the watchdog wrote."""

from __future__ import annotations

from gpucheck.model.kinds import Kind

#: ranks entered one collective with different ops, shapes or dtypes
COLLECTIVE_MISMATCH = Kind("collective-mismatch")
#: a collective entered with tensors on a device its backend cannot use
COLLECTIVE_DEVICE = Kind("collective-device")
#: a rank's process died while the others waited in a collective
RANK_CRASH = Kind("rank-crash")
#: a rank failed its case before a collective the others wait in
RANK_FAILURE = Kind("rank-failure")
#: the watchdog's kinds
KINDS = (COLLECTIVE_MISMATCH, COLLECTIVE_DEVICE, RANK_CRASH, RANK_FAILURE)
