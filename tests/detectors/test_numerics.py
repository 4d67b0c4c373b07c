"""numerics: fingerprints of an op's results, a result that differs between runs of the same
inputs (on real custom ops, on CPU, through op_watch), and disagreement across devices; what
an op leaves unwritten (the unwritten-output probe's evidence) is not a result."""

from __future__ import annotations

import itertools

import extkit
import torch
from torch.overrides import TorchFunctionMode

from gpucheck.detectors import CaseInfo, Numerics, numerics, unwritten, unwritten_probe
from gpucheck.detectors.numerics import conflicts, disagreements, fingerprint, parse
from gpucheck.detectors.unwritten_output import UnwrittenOutput
from gpucheck.model.results import CaseRecord

CASE = CaseInfo("cpu", "s", "test_x.py::test_x")
_count = itertools.count()


@torch.library.custom_op("gpucheck_numerics::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _jitter(x: torch.Tensor) -> torch.Tensor:
    """Every other call nudges element 0 by one ulp (like float atomics in another order)."""
    y = x * 2
    if next(_count) % 2:
        y[0] = torch.nextafter(y[0], torch.tensor(float("inf")))
    return y


@torch.library.custom_op("gpucheck_numerics::jitter", mutates_args=())
def jitter(x: torch.Tensor) -> torch.Tensor:
    return _jitter(x)


@torch.library.custom_op(
    "gpucheck_numerics::atomics", mutates_args=(), tags=(torch.Tag.nondeterministic_bitwise,)
)
def atomics(x: torch.Tensor) -> torch.Tensor:
    return _jitter(x)


def test_fingerprint_is_of_the_bits():
    x = torch.rand(1000)
    assert fingerprint(x) == fingerprint(x.clone())
    y = x.clone()
    y[0] = torch.nextafter(y[0], torch.tensor(1.0))
    assert fingerprint(y) != fingerprint(x)
    assert fingerprint(x.flip(0)) != fingerprint(x)  # position-weighted
    assert fingerprint((x, 3)) != fingerprint((x, 4))  # other arguments count
    assert fingerprint(x.double()) != fingerprint(x)
    assert fingerprint(torch.empty(3, device="meta")) is None
    big = torch.rand((1 << 20) + 7)
    nudged = big.clone()
    nudged[0] += 1
    assert fingerprint(big) != fingerprint(nudged)  # the sample keeps the first element


def _python_sums(tensors, chunk):
    """The sums :func:`gpucheck.detectors.numerics._sums` reads back, in plain Python: each
    tensor's bits as integers (sampled above SAMPLE elements), one tensor after another in
    chunks of at most ``chunk`` elements; per chunk the plain sum and the sum weighted by each
    element's distance from the chunk's end (``n - i``), int64 wrapping as on the device."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    def wrap(v):
        return (v + (1 << 63)) % (1 << 64) - (1 << 63)

    rows, row = [], []
    for t in tensors:
        flat = t.reshape(-1)
        if flat.numel() > numerics.SAMPLE:
            flat = flat[:: -(-flat.numel() // numerics.SAMPLE)]
        if flat.dtype.is_complex:
            flat = torch.view_as_real(flat).reshape(-1)
        bits = flat.view(ints[flat.element_size()]).tolist()
        if row and len(row) + len(bits) > chunk:
            rows.append(row)
            row = []
        row = row + bits
    values = []
    for x in [*rows, row]:
        values += [wrap(sum(x)), wrap(sum((len(x) - i) * v for i, v in enumerate(x)))]
    return values


def _tensors(g):
    """Of one width (float32 and int32; one transposed, one a scalar) and of every width an op
    takes (bool, bytes, 16-bit floats, complex, int64 near its limits and a scalar, a strided
    view), each with a tensor sampled above SAMPLE elements."""
    one_width = [
        torch.rand(300, generator=g),
        torch.randint(-(2**31), 2**31 - 1, (40,), generator=g, dtype=torch.int32),
        torch.rand(9, 7, generator=g).t(),
        torch.rand(numerics.SAMPLE + 3, generator=g),
        torch.rand((), generator=g),
    ]
    widths = [
        torch.rand(300, generator=g),
        torch.rand(7, generator=g) > 0.5,
        torch.randint(0, 256, (33,), generator=g, dtype=torch.uint8),
        torch.rand(5, 4, generator=g).half().t(),
        torch.randn(9, generator=g, dtype=torch.complex64),
        torch.tensor([2**63 - 1, 2**63 - 1, -(2**63), 5]),
        torch.tensor(-3),
        torch.rand(50, 20, generator=g, dtype=torch.float64)[:, ::3],
        torch.rand(numerics.SAMPLE + 3, generator=g),
    ]
    return one_width, widths


def test_the_sums_are_each_chunks_plain_and_position_weighted_sums(monkeypatch):
    """The device-side sums against the same sums in Python: of tensors of one width (one
    ``cat``), of mixed widths (one copy each), of a lone tensor (its own view) and over
    several chunks."""
    one_width, widths = _tensors(torch.Generator().manual_seed(1))
    for chunk in (numerics.CHUNK, 64, 1000):
        monkeypatch.setattr(numerics, "CHUNK", chunk)
        for tensors in (one_width, widths, *([t] for t in one_width + widths)):
            assert numerics._sums(torch, tensors) == _python_sums(tensors, chunk)


def test_a_fingerprint_changes_with_an_element_its_place_or_its_tensor():
    """One element changed, two swapped within a tensor or between two, or two tensors of one
    shape swapped: another digest, for tensors of one width and of mixed widths alike; the same
    values in another memory layout, or as a conjugate or negative view: the same digest."""
    g = torch.Generator().manual_seed(2)
    for b in (torch.rand(6, 5, generator=g), torch.rand(6, 5, generator=g).double()):
        a = torch.rand(6, 5, generator=g)
        c = torch.randint(0, 1000, (4,), generator=g, dtype=torch.int32)
        base = fingerprint((a, b, c))
        nudged = a.clone()
        nudged[3, 1] = torch.nextafter(nudged[3, 1], torch.tensor(2.0))
        swapped = a.clone()
        swapped[0, 0], swapped[5, 4] = a[5, 4], a[0, 0]
        a2, b2 = a.clone(), b.clone()
        a2[2, 2], b2[2, 2] = b[2, 2].to(a.dtype), a[2, 2].to(b.dtype)
        assert b2[2, 2] != b[2, 2]
        changed = {
            fingerprint((nudged, b, c)),
            fingerprint((swapped, b, c)),
            fingerprint((a2, b2, c)),
            fingerprint((a, b, c.flip(0))),
        }
        assert len(changed) == 4 and base not in changed
        assert fingerprint((a, b.t().contiguous().t(), c)) == base
        assert fingerprint(b.t()) == fingerprint(b.t().contiguous())
    a, b = torch.rand(2, 8, generator=g).unbind()
    assert fingerprint((a, b)) != fingerprint((b, a))  # which tensor holds which values
    z = torch.randn(6, generator=g, dtype=torch.complex64)
    assert fingerprint(z.conj()) == fingerprint(z.conj().resolve_conj()) != fingerprint(z)
    assert fingerprint(z.conj().imag) == fingerprint(-z.imag) != fingerprint(z.imag)


def test_a_fingerprint_leaves_masked_elements_and_byte_scratch_out():
    """``left_out``: the masked elements hashed as 0, whatever they hold; ``results_only``:
    a ``uint8`` tensor left out, whatever it holds (but not its place among the tensors)."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.rand(4, 3, generator=g), torch.rand(5, generator=g)
    rows = torch.tensor([True, False, True, False])[:, None]
    other = torch.where(rows, torch.rand(4, 3, generator=g), x)
    zeroed = x.masked_fill(rows, 0.0)
    assert fingerprint((y, x), left_out={1: rows}) == fingerprint((y, other), left_out={1: rows})
    assert fingerprint((y, x), left_out={1: rows}) == fingerprint((y, zeroed))
    assert fingerprint((y, x)) != fingerprint((y, other))
    scratch = torch.randint(0, 256, (32,), generator=g, dtype=torch.uint8)
    assert fingerprint((x, scratch), results_only=True) == fingerprint(
        (x, scratch.flip(0)), results_only=True
    )
    assert fingerprint((x, scratch)) != fingerprint((x, scratch.flip(0)))
    assert fingerprint((x, scratch), results_only=True) != fingerprint(x, results_only=True)


class _Functions(TorchFunctionMode):
    """A torch-function mode that lists what it sees (by name)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _launches(obj):
    """What a fingerprint of ``obj`` runs that would be a kernel or a copy between host and
    device on a GPU: the aten ops that are neither views nor allocations, and the reads back
    (``tolist``, ``item``) and copies to the device (``torch.tensor``)."""
    with _Functions() as functions, extkit.Dispatched() as dispatched:
        digest = numerics._fingerprint(torch, obj, False, {})
    assert digest is not None
    free = ("aten.empty.memory_format", "aten._unsafe_view.default")  # no kernel either
    kernels = [op for op in dispatched.seen if op not in free and not _overload(op).is_view]
    transfers = [f for f in functions.seen if f in ("tolist", "item", "tensor", "cpu", "to")]
    return kernels, transfers


def _overload(name):
    ns, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def test_a_fingerprint_launches_a_few_kernels_whatever_its_tensors_count(monkeypatch):
    """What the fingerprint of a call costs on a GPU under CUDA_LAUNCH_BLOCKING is its
    launches: counted here as the aten ops it runs (each a kernel or cub's two on a GPU) and
    its reads back, so a regression in the count shows on the host."""
    scan = ["aten.cumsum.out", "aten.sum.IntList_out"]
    x = torch.rand(64, 3)
    assert _launches(x) == (scan, ["tolist"])
    splat = (*(torch.rand(n, 3) for n in (10, 20, 30)), torch.arange(7, dtype=torch.int32), 3)
    assert _launches(splat) == (["aten.cat.default", *scan], ["tolist"])
    mixed = (x, torch.arange(5), torch.rand(4) > 0.5)
    assert _launches(mixed) == (["aten.copy_.default"] * 3 + scan, ["tolist"])
    # a tensor not laid out as one row: a copy where it is viewed as one (not among mixed widths)
    assert _launches((x, x.t())) == (["aten.clone.default", "aten.cat.default", *scan], ["tolist"])
    assert _launches((x.t(), torch.arange(5))) == (["aten.copy_.default"] * 2 + scan, ["tolist"])
    monkeypatch.setattr(numerics, "CHUNK", 2 * x.numel())  # two chunks: x and x, then x alone
    assert _launches((x, x, x)) == (["aten.cat.default", *scan, *scan], ["tolist"] * 2)


def _run_case(det, body):
    det.case_started(CASE)
    body()
    found = det.case_finished(CASE)
    return found, det.case_data()


def test_numerics_finds_a_result_that_differs_between_runs():
    x = torch.rand(64)
    found, data = _run_case(
        Numerics(), lambda: [torch.ops.gpucheck_numerics.jitter(x) for _ in range(2)]
    )
    [f] = found
    assert (f.kind, f.severity, f.op) == ("numerics", "error", "gpucheck_numerics::jitter")
    assert "non-deterministic" in f.message and "tag it" in f.hint
    assert len(data.fingerprints) == 2 and {parse(e)[3] for e in data.fingerprints} == {"cpu"}


def test_numerics_quiet_on_deterministic_and_tagged_ops():
    x = torch.rand(64)
    found, data = _run_case(
        Numerics(),
        lambda: [
            (
                torch.ops.gpucheck_numerics.double(x),
                torch.ops.gpucheck_numerics.double(torch.rand(64)),
                torch.ops.gpucheck_numerics.atomics(x),
            )
            for _ in range(3)
        ],
    )
    assert found == []
    # double: x (three times, kept once) and three fresh inputs; atomics (tagged
    # nondeterministic_bitwise): not judged
    ops = [parse(e)[0] for e in data.fingerprints]
    assert ops.count("gpucheck_numerics::double") == 4 and "gpucheck_numerics::atomics" not in ops


@torch.library.custom_op("gpucheck_numerics::outer", mutates_args=())
def outer(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.gpucheck_numerics.jitter(x) + 0  # an op that calls another one


def test_numerics_hashes_the_outermost_call_only_and_still_finds_the_inner_ops_jitter():
    x = torch.rand(64)
    found, data = _run_case(
        Numerics(), lambda: [torch.ops.gpucheck_numerics.outer(x) for _ in range(2)]
    )
    assert [f.op for f in found] == ["gpucheck_numerics::outer"]
    assert {parse(e)[0] for e in data.fingerprints} == {"gpucheck_numerics::outer"}


def test_numerics_caps_fingerprints_per_signature():
    det = Numerics(cap=3)
    x = torch.rand(8)
    _, data = _run_case(det, lambda: [torch.ops.gpucheck_numerics.double(x + i) for i in range(10)])
    assert len(data.fingerprints) == 3


def test_cross_device_disagreement_across_records():
    def rec(dev, case, outs):
        return CaseRecord(
            run_id="r",
            device=dev,
            suite="s",
            case=case,
            mode="blocking",
            status="passed",
            fingerprints=[f"ext::op|in1|{outs}|{dev}"],
        )

    same = [rec("cuda:0", "t[cuda0]", "a"), rec("cuda:1", "t[cuda1]", "a")]
    assert disagreements(same) == []
    differ = [rec("cuda:0", "t[cuda0]", "a"), rec("cuda:1", "t[cuda1]", "b")]
    [f] = disagreements(differ)
    assert f.kind == "numerics" and "cross-device disagreement" in f.message
    assert "cuda:0 and cuda:1" in f.message and "t[cuda1]" in f.evidence
    assert conflicts([("op", "i", "a", "cuda:0"), ("op", "i", "a", "cuda:0")]) == []


_SCRATCH_CALLS = [0]


@torch.library.custom_op("gpucheck_numerics::render_with_scratch", mutates_args=())
def render_with_scratch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An image that is a function of the input, and the rasterizers' opaque byte state for
    backward, whose unwritten part differs call to call (torch.empty, never filled)."""
    _SCRATCH_CALLS[0] += 1
    state = torch.full((32,), _SCRATCH_CALLS[0] % 251, dtype=torch.uint8)
    return x * 2, state


def test_numerics_leaves_an_ops_byte_scratch_out():
    x = torch.rand(64)
    found, data = _run_case(
        Numerics(), lambda: [torch.ops.gpucheck_numerics.render_with_scratch(x) for _ in range(3)]
    )
    assert found == []  # the images are bitwise equal; the byte buffers are not results
    assert len({parse(e)[2] for e in data.fingerprints}) == 1
    # a float result that differs call to call is still a finding
    found, _ = _run_case(
        Numerics(), lambda: [torch.ops.gpucheck_numerics.jitter(x) for _ in range(2)]
    )
    assert [f.kind for f in found] == ["numerics"]


def test_the_hashing_is_unseen_by_the_cases_modes():
    """A case's dispatch and torch-function modes (opcheck's schema check, a logging mode) see
    the op's own torch calls, never the fingerprinting's: it would pay (and log) for each."""
    x = torch.rand(64)
    det = Numerics()
    with _Functions() as functions, extkit.Dispatched() as dispatched:
        found, data = _run_case(det, lambda: torch.ops.gpucheck_numerics.double(x))
    assert not found and len(data.fingerprints) == 1  # it was hashed
    assert dispatched.seen == ["gpucheck_numerics.double.default"], dispatched.seen
    hashing = ("empty", "cumsum", "cat", "sum", "tolist")
    assert not any(s in hashing for s in functions.seen), functions.seen


# -- outputs an op leaves unwritten (the unwritten-output probe's evidence) ------------------


def _twice(op, x):
    """Two calls of one input, their fresh memory holding other bytes each time (what a real
    allocator's reuse does, made sure)."""
    cpu = torch.device("cpu")
    for byte in (0x11, 0x22):
        with unwritten_probe.filling(byte, cpu):
            op(x)


def _with_probe(body, probe=True):
    """numerics, and the unwritten-output probe after it (their order in the registry)."""
    unwritten.MEMORY.clear()
    num, det = Numerics(), UnwrittenOutput()
    num.case_started(CASE)
    if probe:
        det.case_started(CASE)
    try:
        body()
        found = num.case_finished(CASE) + (det.case_finished(CASE) if probe else [])
        return found, num.case_data()
    finally:
        unwritten.MEMORY.clear()


def test_a_conventions_rows_left_unwritten_are_not_results():
    means = torch.rand(6, 3) + 0.5
    means[::2, 2] = -1.0
    found, data = _with_probe(lambda: _twice(torch.ops.gpucheck_tests.cull, means))
    assert [(f.kind, f.severity) for f in found] == [("unwritten-output", "info")]
    assert len({parse(e)[2] for e in data.fingerprints}) == 1  # the culled rows left out
    # without the probe's evidence, the same calls are what the field reported as a false error
    found, _ = _with_probe(lambda: _twice(torch.ops.gpucheck_tests.cull, means), probe=False)
    assert [f.kind for f in found] == ["numerics"] and "non-deterministic" in found[0].message


def test_results_that_differ_only_where_the_op_never_wrote_are_unwritten_not_nondeterministic():
    found, data = _with_probe(lambda: _twice(torch.ops.gpucheck_tests.tail, torch.rand(20)))
    assert {(f.kind, f.severity) for f in found} == {("unwritten-output", "error")}
    [said] = [f for f in found if "the same input gave different results" in f.message]
    assert "only in elements the op never wrote (output 0 (out): 5 of 20 elements" in said.message
    assert "a tail: the last 5 elements" in said.message and "not non-deterministic" in said.message
    outputs = {parse(e)[2] for e in data.fingerprints}
    assert len(outputs) == 2 and len({o.split(numerics.WRITTEN)[1] for o in outputs}) == 1


def test_records_that_differ_only_where_calls_never_wrote_do_not_disagree():
    def rec(dev, outs):
        return CaseRecord(
            run_id="r",
            device=dev,
            suite="s",
            case=f"t[{dev}]",
            mode="blocking",
            status="passed",
            fingerprints=[f"ext::op|in1|{outs}|{dev}"],
        )

    assert disagreements([rec("cuda:0", "a~w"), rec("cuda:1", "b~w")]) == []
    [f] = disagreements([rec("cuda:0", "a~w1"), rec("cuda:1", "b~w2")])
    assert "cross-device disagreement" in f.message


def test_an_output_declared_unwritten_is_not_a_result(monkeypatch):
    monkeypatch.setenv(unwritten.UNWRITTEN_ENV, "gpucheck_tests::tail:out")
    found, data = _with_probe(lambda: _twice(torch.ops.gpucheck_tests.tail, torch.rand(20)))
    assert [(f.kind, f.severity) for f in found] == [("unwritten-output", "info")]
    assert len({parse(e)[2] for e in data.fingerprints}) == 1
