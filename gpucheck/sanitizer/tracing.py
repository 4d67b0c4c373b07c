"""compute-sanitizer records placed among the watched calls of a case: which call was under
way when a record was written, and which tensor of which call its address lies in.

Plain data in, plain data out (CI tests it on recorded logs): the worker's sanitizer passes
note, for every watched call (:mod:`gpucheck.detectors.sanitizer_trace`), where its sanitizer
log ended before and after the call (a :class:`Window`: under ``CUDA_LAUNCH_BLOCKING`` a
kernel's records are written while the call that launched it runs) and where each of its
tensors lies in device memory (a :class:`Span`). :func:`trace` then places every record of a
case's slice of the log:

- its **window**: for an initcheck read, the innermost call under way when it was written;
  for a record of a kernel (:data:`KERNEL_TOOLS`: a racecheck hazard, a memcheck access, a
  synccheck barrier) the call that launched it (:func:`owner`). The tool writes such a record
  when it has analysed the kernel, which may be after the call returned (seen on an H100:
  while gpucheck re-ran the call or hashed its outputs, an :class:`Aside`): the record belongs
  to the call under way, else to the call the aside is for, unless the kernel is defined in
  another library than that call's op and an earlier call's library defines it;
- its **span**: the tensor its ``Address`` lies in, of the latest call that had made it by then
  (an initcheck read of an output the op never wrote, by torch's copy or any later kernel),
  and the element there; or, for an access out of bounds, the tensor whose allocation the tool
  names as the nearest (``and is 193 bytes after the nearest allocation at 0x...``);
- whether it was written during an aside (``Traced.aside``): an initcheck read there is
  gpucheck's own (the unwritten-output convention's marker read, see
  :mod:`gpucheck.detectors.sanitizer_trace`), not the case's; a kernel's record there with no
  call to own it is left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpucheck.sanitizer.parser import SanitizerFinding, placed

#: tools whose records are about the kernel that ran (not about memory a later reader reads)
KERNEL_TOOLS = ("racecheck", "memcheck", "synccheck")
#: ``launches(op, kernel)``: whether the library of ``op`` defines ``kernel`` (None: unknown)
Launches = Callable[[str, str], bool | None]

#: ``193 bytes after the nearest allocation at 0x7f... of size 40,000 bytes``
NEAREST = re.compile(
    r"(?P<n>[\d,]+) bytes? (?P<side>before|after) the nearest allocation at "
    r"(?P<addr>0x[0-9a-fA-F]+)(?: of size (?P<size>[\d,]+) bytes?)?"
)


@dataclass(frozen=True)
class Span:
    """A tensor of a watched call in device memory: an output, or an argument."""

    call: int  # the call's index in the case
    op: str
    label: str  # "output 1 (alpha)", "argument 0 (means)"
    output: int | None  # its index among the call's outputs; None for an argument
    name: str | None  # its name (schema, signature), where known
    ptr: int  # data_ptr: its first element
    base: int  # the start of its storage (the allocation, without the caching allocator)
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    itemsize: int
    dtype: str
    allocated: bool = False  # allocated by the call while it ran (not returned yet)

    @property
    def end(self) -> int:
        """One past the last byte of its last element."""
        if not self.shape or 0 in self.shape:
            return self.ptr + (self.itemsize if not self.shape else 0)
        last = sum((n - 1) * s for n, s in zip(self.shape, self.strides, strict=True))
        return self.ptr + (last + 1) * self.itemsize

    def holds(self, address: int) -> bool:
        return self.ptr <= address < self.end

    def element(self, address: int) -> tuple[int, ...] | None:
        """The index of the element at ``address`` (None: between its elements, a view's
        gap). Strides are taken largest first, as a permuted or sliced layout has them."""
        offset, rest = divmod(address - self.ptr, self.itemsize)
        if rest or offset < 0:
            return None
        index = [0] * len(self.shape)
        for d in sorted(range(len(self.shape)), key=lambda d: -self.strides[d]):
            if self.strides[d] <= 0:
                continue
            index[d], offset = divmod(offset, self.strides[d])
            if index[d] >= self.shape[d]:
                return None
        return tuple(index) if offset == 0 else None

    def describe(self) -> str:
        what = f"shape {list(self.shape)}, {self.dtype}"
        if self.allocated:
            return f"a tensor {self.op} allocated while it ran ({what})"
        return f"{self.label} of {self.op} ({what})"


@dataclass
class Window:
    """A watched call between two places of each sanitizer log (bytes)."""

    call: int
    op: str
    frame: str | None
    start: dict[str, int]
    end: dict[str, int] = field(default_factory=dict)  # empty while it runs

    def encloses(self, log: str, offset: int) -> bool:
        start = self.start.get(log)
        end = self.end.get(log)
        return start is not None and start <= offset and (end is None or offset < end)


@dataclass
class Aside:
    """gpucheck's own work around a call, between two places of each log (``call``: the
    latest call of its thread when it began, the call it is for)."""

    start: dict[str, int]
    end: dict[str, int] = field(default_factory=dict)
    call: Window | None = None

    def encloses(self, log: str, offset: int) -> bool:
        start, end = self.start.get(log), self.end.get(log)
        return start is not None and start <= offset and (end is None or offset < end)


@dataclass
class Calls:
    """What a sanitizer pass noted of a case's watched calls."""

    windows: list[Window] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    asides: list[Aside] = field(default_factory=list)


@dataclass(frozen=True)
class Traced:
    """One record of a case's log, placed."""

    record: SanitizerFinding
    window: Window | None  # the call under way when it was written
    span: Span | None  # the tensor its address lies in (or, out of bounds, lies next to)
    element: tuple[int, ...] | None  # the element of ``span`` at its address
    nearest: str | None = None  # out of bounds: "193 bytes after output 0 of op (...)"
    aside: bool = False  # written while gpucheck did its own work around a call


def address(text: str | None) -> int | None:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


def trace(
    log: str,
    start: int,
    text: str,
    tool: str | None,
    calls: Calls,
    launches: Launches | None = None,
) -> list[Traced]:
    """Every record of ``text`` (the slice of ``log`` from byte ``start``), placed among
    ``calls`` (see the module text); a kernel's record written during an aside that no call
    owns is left out."""
    out = []
    for at, record in placed(text, tool):
        offset = start + at
        asides = [a for a in calls.asides if a.encloses(log, offset)]
        aside = max(asides, key=lambda a: a.start[log]) if asides else None
        window = innermost(calls.windows, log, offset)
        if record.tool in KERNEL_TOOLS:
            window = owner(record, window, aside, calls, log, offset, launches)
            if window is None and aside is not None:
                continue
        placed_at = _place(record, window, calls, log, offset)
        out.append(replace(placed_at, aside=True) if aside is not None else placed_at)
    return out


def innermost(windows: list[Window], log: str, offset: int) -> Window | None:
    """The window under way at ``offset`` that started last."""
    found = [w for w in windows if w.encloses(log, offset)]
    return max(found, key=lambda w: w.start[log]) if found else None


def owner(
    record: SanitizerFinding,
    window: Window | None,
    aside: Aside | None,
    calls: Calls,
    log: str,
    offset: int,
    launches: Launches | None = None,
) -> Window | None:
    """The call that launched the kernel of a record written at ``offset``: the call under
    way (``window``), else the call the aside under way is for; but where ``launches`` says
    that one's op is of a library that does not define the kernel, the latest earlier call
    whose library does (one written outside any call and aside, too); where none does, the
    call under way or the aside's after all (its op may call into another library)."""
    near = [w for w in (window, aside.call if aside else None) if w is not None]
    kernel = record.kernel_name
    if launches is None or not kernel:
        return near[0] if near else None
    for w in near:
        if launches(w.op, kernel) is not False:
            return w
    started = [
        w
        for w in calls.windows
        if w.start.get(log, offset + 1) <= offset and all(w is not n for n in near)
    ]
    for w in sorted(started, key=lambda w: -w.start[log]):
        if launches(w.op, kernel):
            return w
    return near[0] if near else None


def _existing(calls: Calls, log: str, offset: int) -> list[Span]:
    """The spans of calls that had started by ``offset``, latest call first, outputs first."""
    started = {w.call for w in calls.windows if w.start.get(log, offset + 1) <= offset}
    spans = [s for s in calls.spans if s.call in started]
    return sorted(spans, key=lambda s: (-s.call, s.output is None))


def _place(
    record: SanitizerFinding, window: Window | None, calls: Calls, log: str, offset: int
) -> Traced:
    at = address(record.address)
    if at is None or record.space not in (None, "global"):
        return Traced(record, window, None, None)
    spans = _existing(calls, log, offset)
    for span in spans:
        if span.holds(at):
            return Traced(record, window, span, span.element(at))
    near = NEAREST.search(record.address_relation or "")
    if near is not None:
        base = address(near["addr"])
        for span in spans:
            if span.base == base:
                text = f"{near['n']} bytes {near['side']} {span.describe()}"
                return Traced(record, window, span, None, text)
    return Traced(record, window, None, None)
