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
    # a kernel's record written while gpucheck re-ran a call or hashed its outputs: the
    # call's under way all the same, marked as written aside; with no call at all, left out
    aside = Aside({LOG: at}, {LOG: at + 10})
    [t] = tracing.trace(LOG, 0, text, None, Calls([outer], asides=[aside]))
    assert t.window is outer and t.aside
    assert tracing.trace(LOG, 0, text, None, Calls([], asides=[aside])) == []
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


def test_a_kernels_record_written_after_its_call_returned_is_that_calls():
    """compute-sanitizer writes a kernel's record when it has analysed it: on an H100 the
    case's race and the probe's two re-runs' were all written after the call returned
    (recorded log), while gpucheck re-ran it."""
    text = (FIXTURES / "racecheck_smooth_backward_h100.log").read_text()
    at = [i for i in range(len(text)) if text.startswith("========= Error: Race", i)]
    call = Window(0, "ext.smooth_backward", "t.py:30 in Smooth.backward", {LOG: 0}, {LOG: 0})
    probe = Aside({LOG: 0}, {LOG: at[1]}, call=call)  # its first re-runs: the first record
    again = Aside({LOG: at[1]}, {LOG: at[2]}, call=call)
    traced = tracing.trace(LOG, 0, text, "racecheck", Calls([call], asides=[probe, again]))
    assert [(t.window, t.aside) for t in traced] == [(call, True), (call, True), (None, False)]
    # the third, written after the probe: the latest call whose library defines its kernel
    other = Window(1, "other.op", None, {LOG: at[2] - 1}, {LOG: at[2] - 1})
    calls = Calls([call, other], asides=[probe, again])
    by_library = {"ext.smooth_backward": True, "other.op": False}
    traced = tracing.trace(LOG, 0, text, "racecheck", calls, lambda op, _: by_library[op])
    assert [t.window for t in traced] == [call, call, call]


def test_a_record_under_way_in_another_librarys_call_goes_to_the_kernels_library():
    text = (FIXTURES / "racecheck_smooth_backward_h100.log").read_text()
    first = Window(0, "ext.smooth_backward", None, {LOG: 0}, {LOG: 0})
    later = Window(1, "other.op", None, {LOG: 0}, {LOG: len(text)})  # under way when written
    launches = {"ext.smooth_backward": True, "other.op": False}
    traced = tracing.trace(LOG, 0, text, "racecheck", Calls([first, later]), launches.get)
    assert {t.window.op for t in traced} == {"ext.smooth_backward"}
    # where no call's library is known to define the kernel, the call under way keeps it
    unknown = {"ext.smooth_backward": None, "other.op": None}
    traced = tracing.trace(LOG, 0, text, "racecheck", Calls([first, later]), unknown.get)
    assert {t.window.op for t in traced} == {"other.op"}
    nowhere = {"ext.smooth_backward": False, "other.op": False}
    traced = tracing.trace(LOG, 0, text, "racecheck", Calls([first, later]), nowhere.get)
    assert {t.window.op for t in traced} == {"other.op"}


def test_initcheck_reads_written_aside_are_marked_not_owned():
    """An initcheck read during gpucheck's own work is gpucheck's (the marker's read, the
    probe's): placed on its tensor, marked aside, never given a call to own it."""
    text = (FIXTURES / "initcheck_uninit_planted_h200.log").read_text()
    call = Window(0, "ext.rasterize", None, {LOG: 0}, {LOG: 0})
    alpha = _span(0x7F00A4800800, (8, 4), (4, 1), call=0, output=1)
    aside = Aside({LOG: 0}, {LOG: len(text)}, call=call)
    found = tracing.trace(LOG, 0, text, None, Calls([call], [alpha], [aside]))
    assert len(found) == 20 and all(t.aside and t.span is alpha for t in found)
    assert all(t.window is None for t in found)
