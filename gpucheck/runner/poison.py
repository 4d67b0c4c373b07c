"""Making *another* device current before a case, the way real training leaves it.

We measured on 2x H200 that an extension without a device guard passes on cuda:1 in a fresh
process (the runtime's current device follows the tensor while no context exists on cuda:0)
and crashes as soon as another device holds an initialized, current context. So before each
case the harness makes a different device current and allocates on it.
"""

from __future__ import annotations

import torch


def other_device(target: torch.device) -> torch.device | None:
    """The device to make current while ``target`` is tested (None when only one is visible)."""
    count = torch.cuda.device_count()
    if count < 2:
        return None
    index = 0 if target.index is None else target.index
    return torch.device("cuda", (index + 1) % count)


def make_other_device_current(target: torch.device) -> torch.device | None:
    """Set another visible device current and create its context with a real allocation.

    Returns that device, or None when ``target`` is the only visible device (then wrong-device
    defects cannot be provoked and the caller should say so).
    """
    other = other_device(target)
    if other is None:
        torch.cuda.set_device(target)
        return None
    torch.cuda.set_device(other)
    # An allocation plus a kernel make the context real on `other` (not just selected).
    torch.ones(1, device=other).add_(1)
    return other
