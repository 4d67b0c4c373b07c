"""Sanitizer records traced back to the watched call (gpucheck.detectors.sanitizer_trace), on
real watched calls (``torch.library`` ops, and a pybind11 extension built here on CPU whose
library defines a function of a recorded kernel's name) and recorded log text: the log is
written the way compute-sanitizer wrote it on the GPU (a kernel's records while the call that
launched it runs, or after it returned, while gpucheck re-ran it; a later reader's after
it), its addresses moved onto the tensors the calls really returned
(``tests/fixtures/sanitizer/README.md``)."""

from __future__ import annotations

import gzip
import re
import sys
import textwrap
from pathlib import Path

import extkit  # (its ops: gpucheck_tests::cull)
import pytest
import torch

from gpucheck.detectors import op_watch, unwritten
from gpucheck.detectors.base import CaseInfo
from gpucheck.detectors.sanitizer_trace import SanitizerTrace
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.sanitizer import open_calls
from gpucheck.selftest.zoo import zoo_matrix

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sanitizer"
COPY_READ = (FIXTURES / "initcheck_copy_read_derived.log").read_text()
RACE = (FIXTURES / "racecheck_race_planted_h200.log").read_text()
OOB = (FIXTURES / "memcheck_oob_pybind_watched_h200x2.log").read_text()
H100_RACE = (FIXTURES / "racecheck_smooth_backward_h100.log").read_text()
CASE = CaseInfo("cuda:0", "s", "test_x.py::test_masked")
LOG: list[Path] = []  # the log the ops below write to while they run


def _gz(name: str) -> str:
    with gzip.open(FIXTURES / name, "rt") as f:
        return f.read()


def _records(text: str) -> list[str]:
    """The records of a log (each from its first line to its closing blank tool line)."""
    return re.findall(
        r"^========= (?:Error|Uninit|Invalid|Program).*?\n=========\s*\n", text, re.M | re.S
    )


LIB = torch.library.Library("gpucheck_trace_test", "DEF")
LIB.define("race(Tensor x) -> Tensor")
LIB.define("overrun(Tensor x) -> Tensor")
LIB.define("reads_itself(Tensor x) -> Tensor")
LIB.define("rasterize(Tensor colors, Tensor mask) -> (Tensor alpha, Tensor last_ids)")
LIB.define("allocates(Tensor x) -> Tensor")
SEEN_OPEN: list[list[open_calls.OpenCall]] = []  # the calls under way, as read inside a call


@torch.library.impl(LIB, "race", "CPU")
def _race(x):
    _write(RACE)  # racecheck reports while the kernel that races runs
    return x * 2


@torch.library.impl(LIB, "overrun", "CPU")
def _overrun(x):
    out = torch.empty_like(x)
    allocation = f"0x{out.untyped_storage().data_ptr():x}"
    _write(OOB.replace("0x7f5ce1096400", allocation))  # "193 bytes after ... allocation at"
    return out.copy_(x)


@torch.library.impl(LIB, "reads_itself", "CPU")
def _reads_itself(x):
    out = torch.empty_like(x)
    _write(_rebased(COPY_READ, out))  # its kernel reads its output before it writes it
    return out.copy_(x)


@torch.library.impl(LIB, "rasterize", "CPU")
def _rasterize(colors, mask):
    """The masked tiles (16×16) of both outputs are never written; ``last_ids`` reads 0 there
    all the same, as memory fresh from cudaMalloc does."""
    h, w = colors.shape[:2]
    alpha = torch.empty(h, w, 1)
    last = torch.zeros(h, w, dtype=torch.int32)  # zeros: what fresh device memory reads
    keep = mask.repeat_interleave(16, 0).repeat_interleave(16, 1)[:h, :w]
    alpha[keep] = colors[keep].mean(-1, keepdim=True)
    last[keep] = 1
    return alpha, last


@torch.library.impl(LIB, "allocates", "CPU")
def _allocates(x):
    out = torch.empty_like(x)
    SEEN_OPEN.append(open_calls.read(LOG[1]))  # what a worker killed here would leave
    return out.copy_(x)


def _write(text):
    with LOG[0].open("a") as f:
        f.write(text)


def _rebased(text, tensor, recorded=0x7F00A4800800):
    """The log's reads moved onto ``tensor`` (or the address given): its first element where
    the record read ``recorded`` (the derived log's: 0x7f00a4800800)."""
    base = tensor if isinstance(tensor, int) else tensor.data_ptr()
    return re.sub(
        r"Address 0x([0-9a-f]+)",
        lambda m: f"Address 0x{base + int(m.group(1), 16) - recorded:x}",
        text,
    )


@pytest.fixture
def trace(tmp_path):
    log = tmp_path / "sanitizer.1234.log"
    log.write_text("")
    LOG[:] = [log]
    unwritten.MEMORY.clear()
    t = SanitizerTrace(lambda: [log], "initcheck")
    t.begin()
    yield t
    t.end()
    unwritten.MEMORY.clear()


@pytest.fixture
def writing_aside(trace):
    """``writing_aside(text)``: the next aside that starts (gpucheck's own work after a call)
    has ``text`` written to the log, the way the tool wrote a kernel's records late."""
    pending: list[str] = []

    def observer(started: bool) -> None:
        if started and pending:
            _write(pending.pop(0))

    op_watch.ASIDE_OBSERVERS.append(observer)  # after the trace's own: its aside begins first
    yield pending.append
    op_watch.ASIDE_OBSERVERS.remove(observer)


def _findings(trace, tool):
    trace.end()
    log = LOG[0]
    return trace.findings(str(log), 0, log.read_text(), tool, CASE)


def test_an_initcheck_read_of_an_output_never_written_names_op_output_and_reader(trace):
    xy, _ = torch.ops.gpucheck_tests.cull(torch.rand(8, 3) + 0.5)  # no point culled
    _write(_rebased(COPY_READ, xy))  # then torch's copy reads 8 of its elements
    found = {f.kind: f for f in _findings(trace, "initcheck")}
    assert set(found) == {"unwritten-output", "sanitizer"}  # the diagnosis, and its records
    f = found["unwritten-output"]
    assert (f.severity, f.op) == ("error", "gpucheck_tests::cull")
    assert f.message == (
        "output 0 (xy) of `gpucheck_tests::cull` was never written at 8 element(s) read "
        "here ((0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), …); read by torch's copy at "
        "test_x.py:94"
    )
    assert "shape [8, 2], float32" in f.evidence and "strides [2, 1]" in f.evidence
    assert "x8" in found["sanitizer"].message  # the records themselves, as before


def test_a_read_of_rows_the_calls_marker_marks_invalid_is_no_error(trace):
    means = torch.rand(8, 3) + 0.5
    means[:4, 2] = -1.0  # culled: rows 0-3, radius 0; the reads fall in rows 0-3
    xy, radii = torch.ops.gpucheck_tests.cull(means)
    _write(_rebased(COPY_READ, xy))
    [f] = _findings(trace, "initcheck")
    assert (f.kind, f.severity, f.op) == ("unwritten-output", "info", "gpucheck_tests::cull")
    assert "8 initcheck read(s) of output 0 (xy)" in f.message
    assert "output 1 (radii) of the same call is 0 in every row read (4 row(s)" in f.message
    assert radii[:4].tolist() == [0] * 4


def test_a_race_written_while_a_call_ran_is_that_ops_data_race(trace):
    x = torch.rand(4)
    torch.ops.gpucheck_trace_test.race(x)
    with op_watch.aside():  # gpucheck's own re-run of the call: left out
        _write(RACE)
    found = {f.kind: f for f in _findings(trace, "racecheck")}
    assert set(found) == {"data-race", "sanitizer"}
    race = found["data-race"]
    assert (race.severity, race.op, race.kernel) == (
        "error",
        "gpucheck_trace_test::race",
        "shared_race",
    )
    assert race.message.startswith(
        "`gpucheck_trace_test::race` launched shared_race, which races on shared memory "
        "(1 racecheck record(s), 512 hazards) (called from "
    )
    assert "test_sanitizer_trace.py:" in race.message
    assert "__syncthreads" in race.hint


def test_a_race_outside_any_call_of_no_known_library_stays_a_record(trace):
    _write(RACE)
    assert [f.kind for f in _findings(trace, "racecheck")] == ["sanitizer"]


def test_an_out_of_bounds_write_names_the_op_and_the_output_it_overran(trace):
    torch.ops.gpucheck_trace_test.overrun(torch.rand(10000))
    found = {f.kind: f for f in _findings(trace, "memcheck")}
    assert set(found) == {"out-of-bounds", "sanitizer"}
    f = found["out-of-bounds"]
    assert (f.op, f.kernel) == ("gpucheck_trace_test::overrun", "<unnamed>::add_one")
    assert "`gpucheck_trace_test::overrun` launched <unnamed>::add_one, which made 1 invalid " \
        "global write(s): 193 bytes after output 0 of gpucheck_trace_test::overrun " \
        "(shape [10000], float32)" in f.message  # fmt: skip


def test_an_op_that_reads_its_own_output_before_writing_it_is_named_so(trace):
    torch.ops.gpucheck_trace_test.reads_itself(torch.rand(16))
    found = {f.kind: f for f in _findings(trace, "initcheck")}
    assert found["unwritten-output"].message.startswith(
        "output 0 of `gpucheck_trace_test::reads_itself` was read by its own kernel before it "
        "was written, at 8 element(s) (0, 1, 2, 3, 4, 5, …)"
    )


# -- recorded on an H100: records written after the call returned -------------------------

TRACE_EXT = "gpucheck_test_trace_ext"
TRACE_SOURCE = textwrap.dedent("""
    #include <torch/extension.h>
    // a function of the name racecheck gave the kernel on the GPU (a CUDA kernel's host stub
    // carries the same symbol): its library defines "smooth_backward_kernel"
    void smooth_backward_kernel(const float* g, float* out, int n) {
      for (int i = 0; i < n; ++i) out[i] = 0.5f * (g[i] + g[(i + n - 1) % n]);
    }
    at::Tensor smooth_backward(const at::Tensor& grad) {  // [N]
      auto g = grad.contiguous();
      auto out = at::empty_like(g);
      smooth_backward_kernel(g.data_ptr<float>(), out.data_ptr<float>(), g.numel());
      return out;
    }
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
      m.def("smooth_backward", &smooth_backward, py::arg("grad"));
    }
""")


@pytest.fixture(scope="module")
def trace_ext(tmp_path_factory):
    return extkit.build(TRACE_EXT, TRACE_SOURCE, tmp_path_factory)


def test_a_race_written_after_the_call_returned_is_that_calls_data_race(
    trace_ext, trace, writing_aside
):
    """tools/gpu unwritten on an H100: the backward's race and the probe's two re-runs' were
    written after the call returned, while gpucheck re-ran it: all three were left out, and
    no data-race was made. The third here is written after gpucheck's work, when another op
    has run: the kernel's library names the call."""
    race, again, last = _records(H100_RACE)
    writing_aside(race)  # the call's own, in the probe's re-runs
    writing_aside(again)  # the first re-run's, in numerics' hash
    trace_ext.smooth_backward(torch.rand(4096))
    line = f"test_sanitizer_trace.py:{sys._getframe().f_lineno - 1}"
    with op_watch.aside(), op_watch.aside():  # gpucheck's work after the call (nested once)
        pass
    with op_watch.aside():
        pass
    torch.ops.gpucheck_tests.tail(torch.rand(20))  # another op (its library unknown)
    _write(last)  # the second re-run's, outside any call and any aside
    found = _findings(trace, "racecheck")
    (f,) = [f for f in found if f.kind == "data-race"]
    assert (f.op, f.kernel, f.severity) == (
        f"{TRACE_EXT}.smooth_backward",
        "smooth_backward_kernel",
        "error",
    )
    assert f.message.startswith(
        f"`{TRACE_EXT}.smooth_backward` launched smooth_backward_kernel, which races on shared "
        "memory (1 racecheck record(s), 16384 hazards) (called from "
    )
    assert f"{line} in test_a_race_written_after" in f.message
    assert "2 of its 3 records written after the call returned" in f.evidence
    (raw,) = [f for f in found if f.kind == "sanitizer"]
    assert " x3 in smooth_backward_kernel" in raw.message  # the symptoms, all three


def test_the_zoo_race_row_is_found_from_the_selftest_racecheck_log(trace, writing_aside):
    """gpucheck selftest --sanitizer on an H100 missed the zoo's data-race row: the nine
    records of test_ssim_nosync_train (the backward and the probe's two re-runs) were all
    written while gpucheck worked after the call. Placed so again, the row is found."""
    zoo = [r for r in _records(_gz("racecheck_selftest_h100.log.gz")) if "_zoo_ssim_" in r]
    assert len(zoo) == 9
    op = "gpucheck_zoo_ssim_nosync.fusedssim_backward"
    writing_aside("".join(zoo[:3]))
    writing_aside("".join(zoo[3:6]))
    writing_aside("".join(zoo[6:]))
    op_watch.watch_call(op, torch.clone, torch.rand(8))
    for _ in range(3):
        with op_watch.aside():  # the probe's snapshot... re-runs, numerics' hash
            pass
    case = CaseInfo("cuda:0", "selftest", "zoo/test_zoo_ssim.py::test_ssim_nosync_train[cuda0]")
    trace.end()
    found = trace.findings(str(LOG[0]), 0, LOG[0].read_text(), "racecheck", case)
    race = next(f for f in found if f.kind == "data-race")
    assert race.op == op and race.kernel.endswith("ssim_backward_kernel")
    failure = Finding("test-failure", "error", "AssertionError: Tensor-likes are not close!")
    failure.device = "cuda:0"
    record = CaseRecord(
        "r", "cuda:0", "selftest", case.case, "sanitizer:racecheck", "failed",
        findings=[*found, failure],
    )  # fmt: skip
    (row,) = [r for r in zoo_matrix([record], 1) if "tile read before its barrier" in r.row.name]
    assert row.recall == (1, 1) and row.unexpected == []


MASKED = _gz("initcheck_masked_tiles_h100.log.gz")
ALPHA_AT, LAST_IDS_AT = 0x7F6CEC809200, 0x7F6CEC80C200  # where the H100's call put them


def _masked_run(trace, marker_read: bool):
    """The H100's test_4_masked: the rasterizer's call, gpucheck's read of its integer output
    right after it (initcheck reported the masked tiles there: recorded, in the next case's
    slice), torch's copy of alpha (the 512 recorded reads)."""
    records = _records(MASKED)
    copies = "".join(r for r in records if "direct_copy_kernel" in r)
    marker = "".join(r for r in records if "CompareEqFunctor" in r)
    assert (copies.count("Uninitialized"), marker.count("Uninitialized")) == (512, 256)
    mask = torch.ones(4, 3, dtype=torch.bool)
    mask[::2, ::3] = False

    def reads_marker(started):  # gpucheck reads last_ids (the call's latest span) aside
        if started and marker_read:
            (span,) = [s for s in trace.calls.spans if s.label == "output 1 (last_ids)"]
            _write(_rebased(marker, span.ptr, LAST_IDS_AT))

    op_watch.ASIDE_OBSERVERS.append(reads_marker)  # after the trace's: inside its aside
    try:
        alpha, last_ids = torch.ops.gpucheck_trace_test.rasterize(torch.rand(64, 48, 3), mask)
    finally:
        op_watch.ASIDE_OBSERVERS.remove(reads_marker)
    _write(_rebased(copies, alpha, ALPHA_AT))
    return alpha, last_ids


def test_an_integer_output_never_written_is_no_marker(trace):
    """The H100 judged the masked alpha a convention: last_ids, never written either, read 0
    (fresh cudaMalloc memory). Read right after the call, its masked tiles are initcheck
    records at its own addresses: it is no marker, and alpha's reads are the bug's."""
    _, last_ids = _masked_run(trace, marker_read=True)
    found = _findings(trace, "initcheck")
    (f,) = [f for f in found if f.kind == "unwritten-output"]
    assert (f.severity, f.op) == ("error", "gpucheck_trace_test::rasterize")
    assert f.message == (
        "output 0 (alpha) of `gpucheck_trace_test::rasterize` was never written at 512 "
        "element(s) read here ((0, 0, 0), (0, 1, 0), (0, 2, 0), (0, 3, 0), (0, 4, 0), "
        "(0, 5, 0), …); read by torch's copy at test_unwritten_gpu.py:58"
    )
    # the marker's own reads were gpucheck's: not the case's findings, not its symptoms
    assert not [f for f in found if "CompareEq" in (f.message + (f.evidence or ""))]
    assert int((last_ids == 0).sum()) == 512


def test_a_marker_is_accepted_only_where_it_was_written_everywhere(trace):
    """The same reads without initcheck's word on last_ids (an integer output the tool saw
    written everywhere) are the convention's: the rule rests on that evidence alone."""
    _masked_run(trace, marker_read=False)
    (f,) = _findings(trace, "initcheck")
    assert (f.kind, f.severity) == ("unwritten-output", "info")
    assert "output 1 (last_ids) of the same call is 0 in every row read" in f.message
    assert "and was written everywhere" in f.message


def test_the_recorded_projection_reads_are_the_convention(trace):
    means = torch.rand(64, 3) + 0.5
    means[::4, 2] = -1.0  # culled, as on the H100
    xy, radii = torch.ops.gpucheck_tests.cull(means)
    _write(_rebased(_gz("initcheck_projection_h100.log.gz"), xy, 0x7FF212800000))
    radii.fill_(3)  # the case changes the marker afterwards: the call's own values decide
    (f,) = _findings(trace, "initcheck")
    assert (f.kind, f.severity) == ("unwritten-output", "info")
    assert f.message.startswith(
        "32 initcheck read(s) of output 0 (xy) of `gpucheck_tests::cull` fell where it is left "
        "unwritten by design (output 1 (radii) of the same call is 0 in every row read (16 "
        "row(s) of its first 1 dimension(s)) and was written everywhere)"
    )
    assert "read by torch's copy at test_unwritten_gpu.py:34" in f.evidence


def test_a_memcheck_pass_writes_the_calls_under_way_beside_its_logs(tmp_path):
    """What a worker the tool ends inside a call leaves for the controller: the call, its
    line, its arguments' spans and what it allocated so far; nothing once it returned."""
    log = tmp_path / "w.sanitizer.1234.log"
    log.write_text("")
    path = open_calls.path_for(tmp_path / "w.sanitizer.%p.log")
    LOG[:] = [log, path]
    SEEN_OPEN.clear()
    t = SanitizerTrace(lambda: [log], "memcheck", path)
    t.begin()
    try:
        assert open_calls.read(path) == [] and path.exists()
        x = torch.rand(1000)
        torch.ops.gpucheck_trace_test.allocates(x)
        line = f"test_sanitizer_trace.py:{sys._getframe().f_lineno - 1}"
    finally:
        t.end()
    ((call,),) = SEEN_OPEN
    assert call.op == "gpucheck_trace_test::allocates" and line in call.frame
    arg, made = call.spans
    assert (arg.label, arg.ptr, arg.allocated) == ("argument 0 (x)", x.data_ptr(), False)
    assert (made.shape, made.dtype, made.allocated) == ((1000,), "float32", True)
    assert made.describe() == (
        "a tensor gpucheck_trace_test::allocates allocated while it ran (shape [1000], float32)"
    )
    assert open_calls.read(path) == []
