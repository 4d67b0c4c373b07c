"""op_watch: extension-op calls reach listeners, torch's own ops do not; a failing listener
never fails the op; each call carries the line that made it."""

from __future__ import annotations

import sys

import pytest
import torch

from gpucheck.detectors import op_watch


@torch.library.custom_op("gpucheck_watch::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@torch.library.custom_op("gpucheck_watch::fails", mutates_args=())
def fails(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("bad input")


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


def test_a_size_torch_does_not_know_yet_is_not_asked_about():
    """Under opcheck a fake tensor's size can be a data-dependent symbol: deciding whether it
    is a placeholder must not make torch guard on it (a detector-error on every opcheck case
    of the splat suite, 2x H200)."""
    from gpucheck.detectors.op_watch import placeholder

    class Symbolic:
        def __eq__(self, other):
            raise RuntimeError("GuardOnDataDependentSymNode: Could not guard on Eq(u0, 0)")

        __hash__ = object.__hash__

    class Fake:
        def numel(self):
            return Symbolic()

    assert placeholder(Fake()) is False


@torch.library.custom_op("gpucheck_watch::nested", mutates_args=())
def nested(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.gpucheck_watch.double(x)


def test_each_call_knows_how_deep_it_is_and_a_raising_call_leaves_no_depth_behind():
    depths = []

    class Depth:
        def before(self, call):
            depths.append((call.op, call.depth))

        def after(self, call, out):
            pass

    listener = Depth()
    assert op_watch.add(listener)
    try:
        x = torch.rand(4)
        torch.ops.gpucheck_watch.nested(x)
        with pytest.raises(ValueError):
            torch.ops.gpucheck_watch.fails(x)
        torch.ops.gpucheck_watch.double(x)
    finally:
        op_watch.remove(listener)
    assert depths == [
        ("gpucheck_watch::nested", 0),
        ("gpucheck_watch::double", 1),
        ("gpucheck_watch::fails", 0),
        ("gpucheck_watch::double", 0),
    ]


def test_tensors_are_found_in_pytree_order_whatever_holds_them():
    """The watch's own walk of arguments and results finds what torch's pytree finds, in the
    same order (the first one names the op's device): plain, named and torch's return-type
    tuples, lists, dicts and containers only pytree knows."""
    import collections

    import torch
    from torch.utils._pytree import tree_leaves

    from gpucheck.detectors.op_watch import tensors

    pair = collections.namedtuple("pair", "a b")
    x, y, z = torch.rand(2), torch.rand(3), torch.rand(4)
    for obj in (
        ((x, 2.0), {}),
        ((x, [y, z], {"k": y}), {"w": z}),
        pair(x, (y, None)),
        torch.return_types.max((x, y)),
        ({"b": y, "a": x},),
        collections.OrderedDict(b=y, a=x),
        collections.deque([z, x]),
        (1, "a", [x], None),
        "text",
    ):
        want = [t for t in tree_leaves(obj) if isinstance(t, torch.Tensor)]
        got = tensors(obj)
        assert [id(t) for t in got] == [id(t) for t in want], obj
