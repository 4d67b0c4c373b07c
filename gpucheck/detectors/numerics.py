"""numerics: an extension op whose result is not a function of its inputs — it differs between
runs of the same input (non-determinism) or between devices (cross-device disagreement).

Worker side, around each extension-op call (:mod:`gpucheck.detectors.op_watch`): a
fingerprint of the inputs' bits (tensors of any device hash alike, with dtypes and shapes,
and the other arguments) and of the outputs' bits. Two calls of the same op with the same
input fingerprint and different output fingerprints in one case are a finding: on one device
``non-deterministic``, on two ``cross-device``. Every case record keeps its fingerprints
(``fingerprints``: ``op|inputs|outputs|device``), and the parent compares them across the
records of the whole run (:func:`disagreements`), so a case that runs the same input on every
device is compared across its per-device records too.

Comparisons a suite makes with :func:`gpucheck.testing.assert_close` report here too: a
failed one is a ``numerics`` finding that carries the measured errors (largest absolute and
relative error, where, how many elements), and every one is kept in the case record
(``numerics``).

An op's ``uint8`` outputs are not results (:func:`scratch`): the 3DGS rasterizers return
their geometry, binning and image state as opaque byte buffers for their backward, partly
never written, so they differ call to call while the images and gradients are bitwise equal.
They are left out of the output fingerprint (still part of the inputs' when passed back).

Outputs an op leaves unwritten (:mod:`gpucheck.detectors.unwritten`, the evidence of the
``unwritten-output`` probe) are not results either. A convention's rows (an output left
unwritten where another output of the same call, its marker, is 0) are left out of every
fingerprint of the op, per call from that call's own marker, so neither two calls nor two
devices disagree over them. Where a call's probe found elements it never wrote by mistake,
its entry also carries the fingerprint of what it did write (``outputs~written``): two calls
of one input that differ only there are an ``unwritten-output`` finding naming the output, not
non-determinism (and not a cross-device disagreement in the parent).

In an initcheck pass no fingerprint is taken: hashing reads every element of an output,
and the tool would report each read of one never written as the case's.

Ops tagged ``torch.Tag.nondeterministic_bitwise`` (float atomics, by design) and
``nondeterministic_seeded`` (random) are not judged. Fingerprints are taken for the first
:data:`CAP` calls per (op, argument signature) of a case, of the outermost watched calls
only (an op registered with torch that calls a compiled extension's function is hashed once,
not again for the function), and, for tensors of more than
:data:`SAMPLE` elements, over an evenly strided sample of them (the first element included).
"""

from __future__ import annotations

import json
import sys
import threading
import zlib
from collections.abc import Iterable
from typing import Any

from gpucheck.detectors import op_watch, unwritten, unwritten_rule
from gpucheck.detectors.base import READS_REPORTED, CallWatcher, CaseInfo, WorkerContext
from gpucheck.model.kinds import DIAGNOSIS, SYMPTOM, Kind, Role
from gpucheck.model.numerics import Measured
from gpucheck.model.results import CaseData, CaseRecord, Finding

CAP = 16
SAMPLE = 1 << 20
CHUNK = SAMPLE  # elements summed at once (their row, its int64 widening and scan: 20 MiB)
MAX_KEPT = 64  # fingerprints a case record keeps
HINT = (
    "make the result a function of the input alone: no float atomics whose order varies "
    "(accumulate per block and reduce in a fixed order), no uninitialized memory, no "
    "races; if the op is non-deterministic by design, tag it "
    "`torch.Tag.nondeterministic_bitwise` in its schema"
)
_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _ints(torch: Any, t: Any) -> Any:
    """The tensor's elements as integers of their width (its bits), in logical order, in its
    own shape; above :data:`SAMPLE` elements an evenly strided flat sample of them (the first
    element kept). A view (no kernel), but for the flat sample of a tensor that is not laid
    out as one row, and a conjugate or negative view (``x.conj()``, its ``.imag``), whose
    stored bits are not its values."""
    bits = t.detach().resolve_conj().resolve_neg()
    n = bits.numel()
    if n > SAMPLE:
        bits = bits.reshape(-1)[:: -(-n // SAMPLE)]
    if bits.dtype.is_complex:
        bits = torch.view_as_real(bits)
    return bits.view(getattr(torch, _INT[bits.element_size()]))


def _sums(torch: Any, tensors: list[Any]) -> list[int]:
    """Two sums of the tensors' bits (``tensors``: non-empty, of one device) per chunk of at
    most :data:`CHUNK` elements (whole tensors, in order; one tensor above it is a chunk of
    its own): the plain sum of the chunk's integers, one tensor after another, and a sum
    weighted by position (so that a change of order, or of which tensor holds a value,
    shows). The tensors' dtypes and shapes are not in them: the caller hashes those beside.

    Both are exact int64 sums, which wrap around alike in any order of summation, so a
    device's parallel scan and reduction give the host's numbers."""
    values: list[int] = []
    chunk: list[Any] = []
    size = 0
    for bits in [_ints(torch, t) for t in tensors]:
        if chunk and size + bits.numel() > CHUNK:
            values += _scan(torch, chunk, size)
            chunk, size = [], 0
        chunk.append(bits)
        size += bits.numel()
    return values + _scan(torch, chunk, size)


def _scan(torch: Any, chunk: list[Any], size: int) -> list[int]:
    """``[sum, weighted]`` of a chunk's integers (``chunk``: :func:`_ints` views, ``size``
    elements in all) laid out as one row ``x``: ``sum`` of ``x[i]``, and ``weighted``, the sum
    of the row's running sums, ``(size - i) * x[i]`` summed.

    Under CUDA_LAUNCH_BLOCKING every kernel is a round trip, so the launches are the cost. On
    a GPU: the row (:func:`_row`: none for a lone tensor, one ``cat`` for tensors of one
    width, else one copy a tensor); the scan into int64 (a cast or a copy where the row is
    narrower or strided, then cub's two kernels); its sum (one reduction, and a memset on a
    long row), written just after the scan's last element, the plain sum; one copy back of
    those two adjacent values. 4 to 6 launches for a lone tensor, 5 to 7 for any number of
    tensors of one width (float32 and int32 alike: the common case), the tensors' count + 4
    or 5 for mixed widths; one more for each tensor not laid out as one row where it is
    viewed as one (a transposed one; not in the mixed widths' copies). No index, nothing
    copied to the device."""
    scanned = torch.empty(size + 1, dtype=torch.int64, device=chunk[0].device)
    torch.cumsum(_row(torch, chunk, size), 0, dtype=torch.int64, out=scanned[:size])
    torch.sum(scanned[:size], 0, out=scanned[size])
    return scanned[size - 1 :].tolist()


def _row(torch: Any, chunk: list[Any], size: int) -> Any:
    """The chunk's integers one tensor after another, flat: a view of a lone tensor, one
    ``cat`` of tensors of one width (a copy for each not laid out as one row), else each
    copied, widened, into a row of int64 in its own layout."""
    if len(chunk) == 1:
        return chunk[0].reshape(-1)
    if len({bits.dtype for bits in chunk}) == 1:
        return torch.cat([bits.reshape(-1) for bits in chunk])
    row = torch.empty(size, dtype=torch.int64, device=chunk[0].device)
    start = 0
    for bits in chunk:
        row[start : start + bits.numel()].view(bits.shape).copy_(bits)
        start += bits.numel()
    return row


def scratch(t: Any) -> bool:
    """Opaque byte storage (``uint8``): what an op returns for its own backward (the
    rasterizers' geometry, binning and image buffers, partly never written), not a result."""
    return t.dtype == sys.modules["torch"].uint8


def fingerprint(
    obj: Any, results_only: bool = False, left_out: dict[int, Any] | None = None
) -> str | None:
    """A hex digest of the tensors and other values in ``obj``; None when a tensor has no
    memory behind it (fake, meta). ``results_only``: byte scratch (:func:`scratch`) left out
    (an op's outputs: its scratch may differ call to call while its results do not).
    ``left_out``: by the index of a tensor among ``obj``'s tensors, a bool mask (broadcast
    over it) of elements hashed as 0 (elements the op never wrote).

    Its own torch calls run unseen by the torch-function and dispatch modes of the case
    (``opcheck``'s schema check clones and compares the arguments of every op it sees, a
    logging mode would log them): the tensors hashed are plain ones, and the case's modes
    are there for the case's ops, not for gpucheck's. They run aside (:func:`op_watch.aside
    <gpucheck.detectors.op_watch.aside>`): a sanitizer pass does not count its reads of
    never-written elements as the case's."""
    torch = sys.modules["torch"]
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch(), op_watch.aside():
        return _fingerprint(torch, obj, results_only, left_out or {})


def _fingerprint(torch: Any, obj: Any, results_only: bool, left_out: dict[int, Any]) -> str | None:
    from torch.utils._pytree import tree_leaves

    parts: list[Any] = []
    hashed: dict[Any, list[Any]] = {}  # device -> its tensors, one copy back a chunk
    index = -1
    for leaf in tree_leaves(obj):
        if isinstance(leaf, torch.Tensor):
            index += 1
            if not _real(leaf):
                return None
            if results_only and scratch(leaf):
                parts.append("scratch")
                continue
            parts.append((str(leaf.dtype), tuple(leaf.shape)))
            if leaf.numel():
                mask = left_out.get(index)
                if mask is not None and not leaf.is_complex():
                    bits = leaf.detach().view(getattr(torch, _INT[leaf.element_size()]))
                    leaf = bits.masked_fill(mask, 0)
                hashed.setdefault(leaf.device, []).append(leaf)
        else:
            parts.append(repr(leaf))
    values = [_sums(torch, v) for _, v in sorted(hashed.items(), key=lambda kv: str(kv[0]))]
    return f"{zlib.crc32(repr((parts, values)).encode()):08x}"


def _real(t: Any) -> bool:
    torch = sys.modules["torch"]
    return t.device.type in ("cuda", "cpu") and type(t) in (torch.Tensor, torch.nn.Parameter)


def _judged(op: str) -> bool:
    """False for ops tagged non-deterministic by design."""
    torch = sys.modules["torch"]
    ns, sep, name = op.partition("::")
    if not sep:
        return True  # a compiled extension's function (``package._C.function``): no tags
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        tags = {t for o in packet.overloads() for t in getattr(packet, o).tags}
    except Exception:
        return True
    return not tags & {torch.Tag.nondeterministic_bitwise, torch.Tag.nondeterministic_seeded}


#: joins an entry's output fingerprint and that of what the call wrote (``outputs~written``)
WRITTEN = "~"


def only_unwritten(outs: list[tuple[str, str]]) -> bool:
    """Whether outputs that differ (``(device, outputs)``) agree in what the calls wrote:
    every entry carries the fingerprint of its written elements, and those are one."""
    written = {o.partition(WRITTEN)[2] for _, o in outs}
    return all(WRITTEN in o for _, o in outs) and len(written) == 1


def unwritten_finding(op: str, gaps: str, where: CaseInfo, frame: str | None) -> Finding:
    """Two calls of one input that differ only where the op never wrote: the elements the
    probe found unwritten, named (``gaps``), not non-determinism."""
    at = f" (called from {frame})" if frame else ""
    return where.finding(
        unwritten.KIND,
        "error",
        f"{op}: the same input gave different results only in elements the op never "
        f"wrote ({gaps or 'see its unwritten-output finding'}): unwritten, not "
        f"non-deterministic{at}",
        op=op,
        evidence="output fingerprints differ, and agree with the elements the probe found "
        "unwritten left out: what differs is whatever the memory held there"
        + (f"; called from {frame}" if frame else ""),
        hint=unwritten.HINT,
    )


def parse(entry: str) -> tuple[str, str, str, str]:
    """(op, inputs, outputs, device) of a kept fingerprint ``op|inputs|outputs|device``."""
    op, inputs, outputs, device = entry.rsplit("|", 3)
    return op, inputs, outputs, device


def conflicts(
    entries: Iterable[tuple[str, str, str, str]],
) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(op, inputs, [(device, outputs) ...]) for every (op, inputs) seen with more than one
    output fingerprint."""
    seen: dict[tuple[str, str], dict[tuple[str, str], None]] = {}
    for op, inputs, outputs, device in entries:
        seen.setdefault((op, inputs), {})[(device, outputs)] = None
    return [
        (op, inputs, list(outs))
        for (op, inputs), outs in seen.items()
        if len({o for _, o in outs}) > 1
    ]


def _finding(
    op: str,
    inputs: str,
    outs: list[tuple[str, str]],
    where: CaseInfo,
    frame: str | None = None,
) -> Finding:
    devices = sorted({d for d, _ in outs})
    per_device = {d: {o for dd, o in outs if dd == d} for d in devices}
    nondet = any(len(v) > 1 for v in per_device.values())
    what = (
        "non-deterministic: the same input gave different results"
        if nondet
        else f"cross-device disagreement: the same input gave different results "
        f"on {' and '.join(devices)}"
    )
    return where.finding(
        "numerics",
        "error",
        f"{op}: {what}",
        op=op,
        evidence=(
            f"input fingerprint {inputs}; output fingerprints: "
            + "; ".join(f"{d}: {', '.join(sorted(v))}" for d, v in per_device.items())
            + " (bitwise hashes of every output element, sampled above "
            f"{SAMPLE} elements)" + (f"; called from {frame}" if frame else "")
        ),
        hint=HINT,
    )


COVERAGE_HINT = (
    "an op must run every dtype it claims and reject every other one with an "
    "error that names the dtype (not compute it silently, not fail with an "
    "unrelated error)"
)


#: a numerics finding with this in its message says the result is off, not why: a symptom
REFERENCE_MISMATCH = "mismatch against the reference"


def _role(finding: Finding, record: CaseRecord) -> Role:
    return SYMPTOM if REFERENCE_MISMATCH in finding.message else DIAGNOSIS


#: a result that differs between runs of a call or between devices (a diagnosis; a mismatch
#: against the reference only says the result is off: a symptom)
NUMERICS = Kind("numerics", precedence=140, refine=_role)


class Numerics(CallWatcher):
    """Fingerprints extension-op calls; judges a case's calls, and keeps them for the run."""

    name = "numerics"
    kinds = (NUMERICS,)

    def __init__(self, cap: int = CAP) -> None:
        self.cap = cap
        self.watching = False
        self.counts: dict[tuple[Any, ...], int] = {}
        self.entries: list[tuple[str, str, str, str]] = []
        self.lock = threading.Lock()
        self.judged: dict[str, bool] = {}
        self.measured: list[Measured] = []  # gpucheck.testing comparisons of the case
        self.frames: dict[str, str | None] = {}  # op -> the Python line of its first call
        self.hashing = True  # not in an initcheck pass (see bind)
        #: (op, inputs) -> the unwritten elements its probe found (a call that has them)
        self.gaps: dict[tuple[str, str], str] = {}

    def bind(self, worker: WorkerContext) -> None:
        self.hashing = worker.sanitizer != READS_REPORTED  # see READS_REPORTED

    def before(self, call: op_watch.Call) -> None:
        if call.depth or not self.hashing:
            return  # inside another watched call: that call's fingerprints hold what it returns
        found = call.inputs
        if not found or not all(_real(t) for t in found) or op_watch.capturing():
            return  # fake / meta tensors (opcheck, torch.compile) have no bits to hash
        key = (call.op, *((str(t.dtype), tuple(t.shape), str(t.device)) for t in found))
        with self.lock:
            if self.counts.get(key, 0) >= self.cap:
                return
            self.counts[key] = self.counts.get(key, 0) + 1
        if call.op not in self.judged:
            self.judged[call.op] = _judged(call.op)
        if not self.judged[call.op]:
            return
        inputs = fingerprint((call.args, call.kwargs))
        if inputs is not None:
            call.notes["numerics"] = (inputs, str(found[0].device))
            self.frames.setdefault(call.op, call.frame)

    def after(self, call: op_watch.Call, out: Any) -> None:
        noted = call.notes.get("numerics")
        if noted is None or call.error is not None:
            return
        outs = call.outputs(out)
        left = unwritten_rule.left_out(call.op, outs, call.fn)  # a convention's rows, declared ones
        outputs = fingerprint(out, results_only=True, left_out=left)
        evidence = call.notes.get(unwritten.NOTE)
        bugs = evidence.bugs if isinstance(evidence, unwritten.Evidence) else []
        if outputs is not None and bugs:  # and without what the call never wrote
            gaps = {g.index: g.mask | left[g.index] if g.index in left else g.mask for g in bugs}
            outputs += f"{WRITTEN}{fingerprint(out, results_only=True, left_out={**left, **gaps})}"
            with self.lock:
                self.gaps[(call.op, noted[0])] = "; ".join(
                    f"{g.label}: {g.count} of {g.numel} elements ({g.where})" for g in bugs
                )
        if outputs is not None:
            with self.lock:
                self.entries.append((call.op, noted[0], outputs, noted[1]))

    def case_started(self, case: CaseInfo) -> None:
        from gpucheck import testing

        self.counts, self.entries, self.frames, self.gaps = {}, [], {}, {}
        testing.MEASURED.clear()
        self.measured = []
        self.start_watching()

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        from gpucheck import testing

        self.measured = list(testing.MEASURED)
        testing.MEASURED.clear()
        found = [
            case.finding(
                "numerics",
                "error",
                m.message() if m.coverage else f"mismatch against the reference: {m.message()}",
                evidence=json.dumps(m.to_json()),
                hint=COVERAGE_HINT
                if m.coverage
                else "the kernel's result is off by more than the suite's tolerance "
                "for this check; the evidence has the worst element",
            )
            for m in self.measured
            if not m.ok
        ]
        if not self.stop_watching():
            return found
        return found + [
            unwritten_finding(op, self.gaps.get((op, inputs), ""), case, self.frames.get(op))
            if only_unwritten(outs)
            else _finding(op, inputs, outs, case, self.frames.get(op))
            for op, inputs, outs in conflicts(self.entries)
        ]

    def run_finished(self, records: list[CaseRecord]) -> list[Finding]:
        return disagreements(records)

    def case_data(self) -> CaseData:
        """What the case record keeps: its distinct fingerprints and its comparisons."""
        kept = list(dict.fromkeys("|".join(e) for e in self.entries))[:MAX_KEPT]
        return CaseData(fingerprints=kept, numerics=list(self.measured))


def disagreements(records: Iterable[CaseRecord]) -> list[Finding]:
    """Parent side: the same op and input with different outputs in different case records
    (another device, or another run of the case). Conflicts inside one record were already
    reported by the worker."""
    by_key: dict[tuple[str, str], list[tuple[str, str, CaseRecord]]] = {}
    for r in records:
        for entry in r.fingerprints:
            op, inputs, outputs, device = parse(entry)
            by_key.setdefault((op, inputs), []).append((device, outputs, r))
    found = []
    for (op, inputs), seen in by_key.items():
        if len({o for _, o, _ in seen}) < 2 or len({id(r) for _, _, r in seen}) < 2:
            continue
        if any(len({o for _, o, rr in seen if rr is r}) > 1 for _, _, r in seen):
            continue  # already a finding of that case
        if only_unwritten([(d, o) for d, o, _ in seen]):
            continue  # what differs was never written: each case's unwritten-output says so
        first = seen[0][2]
        cases = sorted({f"{r.device} {r.case}" for _, _, r in seen})
        f = _finding(op, inputs, [(d, o) for d, o, _ in seen], first.info)
        f.evidence = f"{f.evidence}\ncases: {'; '.join(cases)}"
        found.append(f)
    return found
