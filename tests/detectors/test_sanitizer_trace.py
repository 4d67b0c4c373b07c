"""Sanitizer records traced back to the watched call (gpucheck.detectors.sanitizer_trace), on
real watched calls of ``torch.library`` ops on CPU and recorded log text: the log is written
the way compute-sanitizer writes it (a kernel's records while the call that launched it runs,
a later reader's after it), its addresses moved onto the tensors the calls really returned
(``tests/fixtures/sanitizer/README.md``)."""

from __future__ import annotations

import re
from pathlib import Path

import extkit  # noqa: F401  (its ops: gpucheck_tests::cull)
import pytest
import torch

from gpucheck.detectors import op_watch, unwritten
from gpucheck.detectors.base import CaseInfo
from gpucheck.detectors.sanitizer_trace import SanitizerTrace

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sanitizer"
COPY_READ = (FIXTURES / "initcheck_copy_read_derived.log").read_text()
RACE = (FIXTURES / "racecheck_race_planted_h200.log").read_text()
OOB = (FIXTURES / "memcheck_oob_pybind_watched_h200x2.log").read_text()
CASE = CaseInfo("cuda:0", "s", "test_x.py::test_masked")
LOG: list[Path] = []  # the log the ops below write to while they run

LIB = torch.library.Library("gpucheck_trace_test", "DEF")
LIB.define("race(Tensor x) -> Tensor")
LIB.define("overrun(Tensor x) -> Tensor")
LIB.define("reads_itself(Tensor x) -> Tensor")


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


def _write(text):
    with LOG[0].open("a") as f:
        f.write(text)


def _rebased(text, tensor):
    """The derived log's reads moved onto ``tensor``: its first element where the record
    read 0x7f00a4800800."""
    base = tensor.data_ptr()
    return re.sub(
        r"Address 0x([0-9a-f]+)",
        lambda m: f"Address 0x{base + int(m.group(1), 16) - 0x7F00A4800800:x}",
        text,
    )


@pytest.fixture
def trace(tmp_path):
    log = tmp_path / "sanitizer.1234.log"
    log.write_text("")
    LOG[:] = [log]
    unwritten.MEMORY.clear()
    t = SanitizerTrace(lambda: [log])
    t.begin()
    yield t
    t.end()
    unwritten.MEMORY.clear()


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
