"""op_watch: extension-op calls reach listeners, torch's own ops do not; and the detectors
that listen (op-device, numerics) on real custom ops, on CPU."""

from __future__ import annotations

import itertools
import sys

import pytest
import torch

from gpucheck.detectors import CaseInfo, Numerics, op_watch
from gpucheck.detectors.numerics import conflicts, disagreements, fingerprint, parse
from gpucheck.model.results import CaseRecord

CASE = CaseInfo("cpu", "s", "test_x.py::test_x")
_count = itertools.count()


@torch.library.custom_op("gpucheck_watch::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@torch.library.custom_op("gpucheck_watch::fails", mutates_args=())
def fails(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("bad input")


def _jitter(x: torch.Tensor) -> torch.Tensor:
    """Every other call nudges element 0 by one ulp (like float atomics in another order)."""
    y = x * 2
    if next(_count) % 2:
        y[0] = torch.nextafter(y[0], torch.tensor(float("inf")))
    return y


@torch.library.custom_op("gpucheck_watch::jitter", mutates_args=())
def jitter(x: torch.Tensor) -> torch.Tensor:
    return _jitter(x)


@torch.library.custom_op(
    "gpucheck_watch::atomics", mutates_args=(), tags=(torch.Tag.nondeterministic_bitwise,)
)
def atomics(x: torch.Tensor) -> torch.Tensor:
    return _jitter(x)


class Log:
    def __init__(self):
        self.seen = []

    def before(self, call):
        self.seen.append(("before", call.op))

    def after(self, call, out):
        self.seen.append(("after", call.op, type(call.error).__name__ if call.error else None))


def test_listeners_see_extension_ops_only():
    log = Log()
    assert op_watch.add(log)
    try:
        x = torch.rand(4)
        torch.ops.gpucheck_watch.double(x)
        torch.ops.gpucheck_watch.double.default(x)
        torch.ops.aten.add(x, 1)
        x + 1
        with pytest.raises(ValueError, match="bad input"):
            torch.ops.gpucheck_watch.fails(x)
    finally:
        assert op_watch.remove(log) is None
    dbl = "gpucheck_watch::double"
    assert log.seen == [
        ("before", dbl),
        ("after", dbl, None),
        ("before", dbl),
        ("after", dbl, None),
        ("before", "gpucheck_watch::fails"),
        ("after", "gpucheck_watch::fails", "ValueError"),
    ]
    torch.ops.gpucheck_watch.double(torch.rand(2))
    assert len(log.seen) == 6  # removed: no more calls


def test_a_failing_listener_never_fails_the_op():
    class Broken:
        def before(self, call):
            raise RuntimeError("listener bug")

        def after(self, call, out):
            pass

    b = Broken()
    op_watch.add(b)
    x = torch.rand(3)
    assert torch.equal(torch.ops.gpucheck_watch.double(x), x * 2)
    err = op_watch.remove(b)
    assert isinstance(err, RuntimeError) and "listener bug" in str(err)


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


def _run_case(det, body):
    det.case_started(CASE)
    body()
    found = det.case_finished(CASE)
    return found, det.case_data()


def test_numerics_finds_a_result_that_differs_between_runs():
    x = torch.rand(64)
    found, data = _run_case(
        Numerics(), lambda: [torch.ops.gpucheck_watch.jitter(x) for _ in range(2)]
    )
    [f] = found
    assert (f.kind, f.severity, f.op) == ("numerics", "error", "gpucheck_watch::jitter")
    assert "non-deterministic" in f.message and "tag it" in f.hint
    assert len(data["fingerprints"]) == 2 and {parse(e)[3] for e in data["fingerprints"]} == {"cpu"}


def test_numerics_quiet_on_deterministic_and_tagged_ops():
    x = torch.rand(64)
    found, data = _run_case(
        Numerics(),
        lambda: [
            (
                torch.ops.gpucheck_watch.double(x),
                torch.ops.gpucheck_watch.double(torch.rand(64)),
                torch.ops.gpucheck_watch.atomics(x),
            )
            for _ in range(3)
        ],
    )
    assert found == []
    # double: x (three times, kept once) and three fresh inputs; atomics (tagged
    # nondeterministic_bitwise): not judged
    ops = [parse(e)[0] for e in data["fingerprints"]]
    assert ops.count("gpucheck_watch::double") == 4 and "gpucheck_watch::atomics" not in ops


def test_numerics_caps_fingerprints_per_signature():
    det = Numerics(cap=3)
    x = torch.rand(8)
    _, data = _run_case(det, lambda: [torch.ops.gpucheck_watch.double(x + i) for i in range(10)])
    assert len(data["fingerprints"]) == 3


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


def test_a_call_carries_the_line_that_made_it():
    """The nearest frame outside gpucheck and torch: the caller's line, not torch's _ops.py."""
    log = Log()
    calls = []
    log.before = calls.append
    op_watch.add(log)
    try:
        here = sys._getframe().f_lineno
        torch.ops.gpucheck_watch.double(torch.rand(2))
        torch.ops.gpucheck_watch.double.default(torch.rand(2))
    finally:
        op_watch.remove(log)
    name = "test_a_call_carries_the_line_that_made_it"
    assert [c.frame.rsplit("test_op_watch.py:", 1)[1] for c in calls] == [
        f"{here + 1} in {name}",
        f"{here + 2} in {name}",
    ]
    assert calls[0].autograd is None and calls[0].fn is not None


_SCRATCH_CALLS = [0]


@torch.library.custom_op("gpucheck_watch::render_with_scratch", mutates_args=())
def render_with_scratch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An image that is a function of the input, and the rasterizers' opaque byte state for
    backward, whose unwritten part differs call to call (torch.empty, never filled)."""
    _SCRATCH_CALLS[0] += 1
    state = torch.full((32,), _SCRATCH_CALLS[0] % 251, dtype=torch.uint8)
    return x * 2, state


def test_numerics_leaves_an_ops_byte_scratch_out():
    x = torch.rand(64)
    found, data = _run_case(
        Numerics(), lambda: [torch.ops.gpucheck_watch.render_with_scratch(x) for _ in range(3)]
    )
    assert found == []  # the images are bitwise equal; the byte buffers are not results
    assert len({parse(e)[2] for e in data["fingerprints"]}) == 1
    # a float result that differs call to call is still a finding
    found, _ = _run_case(Numerics(), lambda: [torch.ops.gpucheck_watch.jitter(x) for _ in range(2)])
    assert [f.kind for f in found] == ["numerics"]
