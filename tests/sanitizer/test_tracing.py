"""compute-sanitizer records placed among a case's watched calls (gpucheck.sanitizer.tracing),
on recorded logs: the element an address names (strided views too), the call under way when a
record was written (the innermost), gpucheck's own work left out, and the tensor an
out-of-bounds access lies next to."""

from __future__ import annotations

from pathlib import Path

from gpucheck.sanitizer import tracing
from gpucheck.sanitizer.tracing import Aside, Calls, Span, Window

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sanitizer"
LOG = "worker.log"


def _span(ptr, shape, strides, call=0, output=0, base=None):
    return Span(call, "ext.op", f"output {output}", output, None, ptr, base or ptr, shape,
                strides, 4, "float32")  # fmt: skip


def test_an_address_names_its_element_in_any_layout():
    rows = _span(0x1000, (4, 4), (4, 1))
    assert rows.element(0x1000 + 4 * 5) == (1, 1)
    assert rows.holds(0x1000 + 4 * 15) and not rows.holds(0x1000 + 4 * 16)
    assert rows.element(0x1000 + 4 * 5 + 2) is None  # inside an element, not at its start
    transposed = _span(0x1000, (4, 4), (1, 4))
    assert transposed.element(0x1000 + 4) == (1, 0)
    corner = _span(0x1000, (2, 2), (4, 1))  # x[:2, :2] of a 4x4
    assert corner.element(0x1000 + 4 * 4) == (1, 0)
    assert corner.element(0x1000 + 4 * 2) is None  # x[0, 2]: in its range, not its element


def test_records_are_placed_in_the_innermost_call_under_way():
    text = (FIXTURES / "racecheck_race_planted_h200.log").read_text()
    at = text.index("========= Error: Race")  # where the record starts
    outer = Window(0, "ext.backward", "f.py:3 in Fn.backward", {LOG: 0}, {LOG: len(text)})
    inner = Window(1, "ext.backward_kernel_launcher", None, {LOG: at}, {LOG: at + 500})
    [t] = tracing.trace(LOG, 0, text, None, Calls([outer, inner]))
    assert t.window is inner and t.record.kernel_name == "shared_race"
    [t] = tracing.trace(LOG, 0, text, None, Calls([outer]))
    assert t.window is outer
    # written while gpucheck re-ran a call or hashed its outputs: not the case's
    aside = Aside({LOG: at}, {LOG: at + 10})
    assert tracing.trace(LOG, 0, text, None, Calls([outer], asides=[aside])) == []
    # a slice read from byte 100 of the log: its offsets are the log's
    late = Window(0, "ext.op", None, {LOG: 100 + at}, {LOG: 100 + at + 1})
    [t] = tracing.trace(LOG, 100, text, None, Calls([late]))
    assert t.window is late


def test_an_initcheck_address_lies_in_an_output_of_an_earlier_call():
    text = (FIXTURES / "initcheck_uninit_planted_h200.log").read_text()
    call = Window(0, "ext.rasterize", None, {LOG: 0}, {LOG: 0})  # done before the reads
    later = Window(1, "ext.other", None, {LOG: len(text)}, {LOG: len(text)})  # after them
    alpha = _span(0x7F00A4800800, (8, 4), (4, 1), call=0, output=1)
    reused = _span(0x7F00A4800800, (32,), (1,), call=1, output=0)  # the memory, reused later
    found = tracing.trace(LOG, 0, text, None, Calls([call, later], [alpha, reused]))
    assert len(found) == 20 and all(t.span is alpha and t.window is None for t in found)
    assert [t.element for t in found[:6]] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]


def test_an_out_of_bounds_access_names_the_tensor_it_lies_next_to():
    text = (FIXTURES / "memcheck_oob_pybind_watched_h200x2.log").read_text()
    call = Window(0, "ext.add_one_overrun", "t.py:67 in test_overrun", {LOG: 0}, {LOG: len(text)})
    out = Span(0, "ext.add_one_overrun", "output 0", 0, None, 0x7F5CE1096400, 0x7F5CE1096400,
               (10000,), (1,), 4, "float32")  # fmt: skip
    arg = Span(0, "ext.add_one_overrun", "argument 0 (x)", None, "x", 0x7F5C00000000,
               0x7F5C00000000, (10000,), (1,), 4, "float32")  # fmt: skip
    traced = tracing.trace(LOG, 0, text, "memcheck", Calls([call], [arg, out]))
    first = traced[0]
    assert first.window is call and first.span is out and first.element is None
    assert first.nearest == (
        "193 bytes after output 0 of ext.add_one_overrun (shape [10000], float32)"
    )
