"""Making *another* device current before a case, the way real training leaves it.

We measured on 2x H200 that an extension without a device guard passes on cuda:1 in a fresh
process (the runtime's current device follows the tensor while no context exists on cuda:0)
and crashes as soon as another device holds an initialized, current context. So before each
case the harness makes a different device current and allocates on it.

It also makes a non-default stream current on the target device (the poisoned stream): an
extension that launches on stream 0 instead of the caller's current stream then runs
unordered with the caller's work, and the wrong-stream detector sees the kernel on another
stream than the current one. By default (stream 0 current everywhere) the two coincide.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

#: one poisoned stream per device for the whole worker: memory the caching allocator hands
#: out stays on one stream (a fresh stream per case would strand cached blocks on each)
_STREAMS: dict[int, torch.cuda.Stream] = {}


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


def poisoned_stream(device: torch.device) -> torch.cuda.Stream:
    """The non-default stream made current on ``device`` while a case runs."""
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _STREAMS:
        _STREAMS[index] = torch.cuda.Stream(device=torch.device("cuda", index))
    return _STREAMS[index]


@contextmanager
def stream_made_current(device: torch.device) -> Iterator[torch.cuda.Stream]:
    """Make the poisoned stream current on ``device`` (the current stream is per device),
    ordered after the work already queued on the previous one; restore it on exit, ordered
    after the poisoned stream's work."""
    stream = poisoned_stream(device)
    before = torch.cuda.current_stream(device)
    stream.wait_stream(before)
    _set_stream_keep_device(stream)
    try:
        yield stream
    finally:
        _set_stream_keep_device(before)
        before.wait_stream(stream)


def _set_stream_keep_device(stream: torch.cuda.Stream) -> None:
    """``torch.cuda.set_stream`` also makes the stream's device current: undo that part,
    the current device is poisoned on purpose."""
    current = torch.cuda.current_device()
    torch.cuda.set_stream(stream)
    if torch.cuda.current_device() != current:
        torch.cuda.set_device(current)
