"""A memcheck worker that compute-sanitizer ends inside a call: the calls it had under way
(gpucheck.sanitizer.open_calls, written beside its logs) and the out-of-bounds finding the
controller makes of them (gpucheck.sanitizer.findings.crash_findings), on the log recorded on
an H100: ``test_7_overrun`` wrote one element past the output ``at::empty_like`` gave it, and
the worker died before the call returned."""

from __future__ import annotations

import gzip
from pathlib import Path

from gpucheck.model.results import CaseInfo
from gpucheck.sanitizer import open_calls
from gpucheck.sanitizer.findings import crash_findings
from gpucheck.sanitizer.tracing import Span

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sanitizer"
OP = "gpucheck_verify_unwritten.overrun"
#: the case the worker died in, as the controller names it
WHERE = CaseInfo("cuda:0", "unwritten", "test_unwritten.py::test_7_overrun")
#: the call as the worker wrote it before the crash: its line (the record's), its argument
#: and the tensor it allocated (the record's nearest allocation: 4,000 bytes at 0x7f9539002000)
FRAME = "build/gpu-work/unwritten/out/suite/test_unwritten_gpu.py:76 in test_7_overrun"
X = Span(0, OP, "argument 0 (x)", None, "x", 0x7F9539000000, 0x7F9539000000, (1000,), (1,), 4,
         "float32")  # fmt: skip
OUT = Span(0, OP, "a tensor it allocated", None, None, 0x7F9539002000, 0x7F9539002000, (1000,),
           (1,), 4, "float32", allocated=True)  # fmt: skip


def _log() -> str:
    with gzip.open(FIXTURES / "memcheck_overrun_crash_h100.log.gz", "rt") as f:
        return f.read()


def test_the_calls_under_way_are_read_back_as_written(tmp_path):
    path = open_calls.path_for(tmp_path / "cuda0.sanitizer-memcheck.sanitizer.%p.log")
    assert path.name == "cuda0.sanitizer-memcheck.sanitizer.calls.json"
    calls = [open_calls.OpenCall(OP, FRAME, [X, OUT])]
    open_calls.write(path, calls)
    assert open_calls.read(path) == calls
    open_calls.write(path, [])
    assert open_calls.read(path) == []
    # torn or foreign content reads as nothing, a bad span is left out
    path.write_text("[{")
    assert open_calls.read(path) == []
    path.write_text('[{"op": "x.y", "frame": null, "spans": [{"call": "0"}]}]')
    assert open_calls.read(path) == [open_calls.OpenCall("x.y", None, [])]
    assert open_calls.read(tmp_path / "missing.json") == []


def test_the_overrun_that_killed_the_worker_is_out_of_bounds_of_the_call_under_way():
    calls = [open_calls.OpenCall(OP, FRAME, [X, OUT])]
    (f,) = crash_findings("w.log", _log(), "memcheck", calls, WHERE)
    assert (f.kind, f.severity, f.op, f.kernel) == ("out-of-bounds", "error", OP, "overrun_kernel")
    assert (f.device, f.suite, f.case) == (WHERE.device, WHERE.suite, WHERE.case)
    assert f.message == (
        f"`{OP}` launched overrun_kernel, which made 1 invalid global write(s): 1 bytes after "
        f"a tensor {OP} allocated while it ran (shape [1000], float32) (called from {FRAME})"
    )
    assert "the worker died inside the call" in f.evidence
    assert "Invalid __global__ write of size 4 bytes" in f.evidence


def test_a_record_of_another_line_or_no_call_under_way_is_left_alone():
    other = [open_calls.OpenCall(OP, FRAME.replace(":76 ", ":80 "))]
    assert crash_findings("w.log", _log(), "memcheck", other, WHERE) == []
    assert crash_findings("w.log", _log(), "memcheck", [], WHERE) == []
