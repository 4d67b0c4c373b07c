"""The compute-sanitizer parser on real recorded logs (tests/fixtures/sanitizer/) and on
records in the documented wording of other tools and older releases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import gpucheck

from gpucheck.sanitizer import parse, parse_file
from gpucheck.sanitizer.parser import kernel_name

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sanitizer"
UNGUARDED = FIXTURES / "memcheck_unguarded_launch_h200x2.log"


def test_real_memcheck_log_of_an_unguarded_launch():
    report = parse_file(UNGUARDED)
    assert report.tool == "memcheck"
    assert report.errors_reported == 231684
    assert report.errors_not_printed == 231584
    assert report.errors_printed == 3
    assert report.target_failed and report.summary_seen and not report.clean
    oob = report.findings[0]
    assert oob.count == 3  # three identical records (threads 0..2) folded
    assert (oob.error, oob.access, oob.space, oob.size) == (
        "Invalid __global__ read of size 4 bytes",
        "read",
        "global",
        4,
    )
    assert oob.kernel == "add1(const float *, float *, int)"
    assert oob.kernel_name == "add1"
    assert oob.offset == "0xc0"
    assert (oob.thread, oob.block) == ("(0,0,0)", "(8,0,0)")
    assert oob.address == "0x7f5ba2802000"
    assert oob.address_relation == (
        "8,904,704 bytes before the nearest allocation at 0x7f5ba3080000 of size 65,536 bytes"
    )
    assert oob.host_frames[0] == "unguarded(at::Tensor) [0x1034c8] in unguarded_ext.so"
    assert oob.python_frame == "unguarded_add.py:54"
    assert oob.source is None  # built without -lineinfo
    # interleaved program output (the traceback, torch warnings) produced no findings
    assert all("Traceback" not in f.error for f in report.findings)
    assert report.findings[1].access == "process"


def test_cli_json_matches_the_documented_shape():
    proc = gpucheck("parse-sanitizer", str(UNGUARDED), "--json")
    assert proc.returncode == 1  # findings of severity error
    data = json.loads(proc.stdout)
    assert {"tool", "errors_reported", "errors_printed", "findings"} <= set(data)
    f = data["findings"][0]
    for key in (
        "kind",
        "severity",
        "tool",
        "error",
        "access",
        "space",
        "size",
        "kernel",
        "kernel_name",
        "offset",
        "thread",
        "block",
        "address",
        "address_relation",
        "host_frames",
        "python_frame",
        "source",
        "count",
    ):
        assert key in f, key
    assert f["kind"] == "sanitizer" and f["count"] == 3


def _log(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def test_clean_run():
    report = parse(
        _log(
            "========= COMPUTE-SANITIZER",
            "hello from the program",
            "========= ERROR SUMMARY: 0 errors",
        )
    )
    assert report.clean and report.errors_reported == 0 and report.findings == []


def test_older_wording_and_lineinfo():
    report = parse(
        _log(
            "========= CUDA-MEMCHECK",
            "========= Invalid __shared__ write of size 8 bytes",
            "=========     at 0x00000150 in /src/k.cu:42:void scale<double>(double*, int)",
            "=========     by thread (31,0,0) in block (2,1,0)",
            "=========     Address 0x00000400 is out of bounds",
            "=========",
            "========= ERROR SUMMARY: 1 error",
        )
    )
    f = report.findings[0]
    assert (f.space, f.access, f.size) == ("shared", "write", 8)
    assert f.kernel == "void scale<double>(double*, int)" and f.kernel_name == "scale<double>"
    assert f.source == "/src/k.cu:42" and f.offset == "0x00000150"
    assert f.address == "0x00000400" and f.address_relation == "is out of bounds"
    assert (f.thread, f.block) == ("(31,0,0)", "(2,1,0)")
    assert report.errors_reported == 1


def test_new_wording_with_lineinfo_and_device_frames():
    report = parse(
        _log(
            "========= Invalid __global__ write of size 4 bytes",
            "=========     at void gpucheck::knn::search<3>(const float3 *, float *, int)+0x2f0 in "
            "knn_cuda.cu:118",
            "=========     by thread (5,0,0) in block (0,0,0)",
            "=========     Access to 0x7f00 is out of bounds",
            "=========     and is 4 bytes after the nearest allocation at 0x7e00 of size 256 bytes",
            "=========     Device Frame: helper(float3) in knn_cuda.cu:80",
            "=========     Host Frame: test_knn in /suites/knn/test_knn.py:31",
            "=========",
            "========= ERROR SUMMARY: 1 error",
        )
    )
    f = report.findings[0]
    assert f.kernel_name == "gpucheck::knn::search<3>"
    assert f.source == "knn_cuda.cu:118"
    assert f.python_frame == "/suites/knn/test_knn.py:31"
    assert f.address_relation.startswith("4 bytes after the nearest allocation")


def test_racecheck_hazards():
    report = parse(
        _log(
            "========= COMPUTE-SANITIZER",
            "========= Error: Race reported between Write access at reduce(float *)+0x140 "
            "in r.cu:9",
            "=========     and Read access at reduce(float *)+0xe0 in r.cu:12 [4 hazards]",
            "=========     and Write access at reduce(float *)+0x140 in r.cu:9 [5 hazards]",
            "=========",
            "========= Warning: Race reported between Read access at reduce(float *)+0x20",
            "=========     and Write access at reduce(float *)+0x40 [1 hazards]",
            "=========",
            "========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)",
        )
    )
    assert report.tool == "racecheck" and report.errors_reported == 2
    err, warn = report.findings
    assert err.severity == "error" and warn.severity == "warning"
    assert err.kernel_name == "reduce" and err.source == "r.cu:9" and err.hazards == 9
    assert err.access == "write/read/write" and err.space == "shared"


def test_initcheck_synccheck_api_and_leaks():
    init = parse(
        _log(
            "========= Uninitialized __global__ memory read of size 4 bytes",
            "=========     at use(int *, int *)+0x70",
            "=========     by thread (0,0,0) in block (0,0,0)",
            "=========     Address 0x7f0000 ",
            "=========",
            "========= ERROR SUMMARY: 1 error",
        )
    )
    assert init.tool == "initcheck"
    assert (init.findings[0].access, init.findings[0].space) == ("read", "global")
    sync = parse(
        _log(
            "========= Barrier error detected. Divergent thread(s) in warp",
            "=========     at diverge()+0x60",
            "=========     by thread (3,0,0) in block (0,0,0)",
            "=========",
            "========= ERROR SUMMARY: 1 error",
        )
    )
    assert sync.tool == "synccheck" and sync.findings[0].access == "barrier"
    assert sync.findings[0].kernel_name == "diverge"
    api = parse(
        _log(
            '========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on '
            "CUDA API call to cudaMemcpy.",
            "=========     Saved host backtrace up to driver entry point at error",
            "=========     Host Frame: main [0x1234] in app",
            "=========",
            "========= Leaked 1,024 bytes at 0x7f00",
            "=========",
            "========= LEAK SUMMARY: 1024 bytes leaked in 1 allocations",
            "========= ERROR SUMMARY: 2 errors",
        )
    )
    kinds = [(f.access, f.severity) for f in api.findings]
    assert kinds[0] == ("api", "error") and api.findings[0].api_call == "cudaMemcpy"
    assert api.leaked_bytes == 1024


@pytest.mark.parametrize("name", ["add1(const float *, float *, int)", "void add1(float*)", "add1"])
def test_kernel_name_strips_arguments_and_return_type(name):
    assert kernel_name(name) == "add1"


def test_recorded_logs_of_every_tool_parse_without_leftovers():
    """Every log recorded on the GPU (fixtures/sanitizer/*.log): each record is understood."""
    logs = sorted(FIXTURES.glob("*.log"))
    assert logs
    for log in logs:
        report = parse_file(log)
        assert report.summary_seen, log.name
        for f in report.findings:
            if f.access not in ("process", "api", "leak", "barrier"):
                assert f.kernel_name, (log.name, f.error)


def test_recorded_memcheck_out_of_bounds_with_lineinfo():
    report = parse_file(FIXTURES / "memcheck_oob_planted_h200.log")
    assert (report.tool, report.errors_reported, report.errors_printed) == ("memcheck", 27, 20)
    (f,) = report.findings
    assert f.count == 20 and f.error == "Invalid __global__ write of size 4 bytes"
    assert (f.kernel_name, f.offset, f.source) == ("oob_write", "0xa0", "planted.cu:9")
    assert f.address_relation == (
        "1 bytes after the nearest allocation at 0x7fbf9a800000 of size 4,000 bytes"
    )
    assert f.host_frames == ["main [0x8da5] in planted"]


def test_recorded_racecheck_initcheck_api_and_clean():
    race = parse_file(FIXTURES / "racecheck_race_planted_h200.log")
    (f,) = race.findings
    assert race.tool == "racecheck" and race.errors_reported == 1
    assert (f.access, f.hazards, f.source, f.kernel_name) == (
        "write/read",
        512,
        "planted.cu:14",
        "shared_race",
    )
    init = parse_file(FIXTURES / "initcheck_uninit_planted_h200.log")
    assert init.tool == "initcheck" and init.errors_reported == 1000
    assert init.findings[0].source == "planted.cu:20" and init.findings[0].count == 20
    api = parse_file(FIXTURES / "memcheck_api_planted_h200.log")
    assert api.findings[0].api_call == "cudaMemcpy" and api.errors_reported == 1
    assert parse_file(FIXTURES / "memcheck_clean_planted_h200.log").clean


def test_recorded_synccheck_names_the_kernel_not_the_inlined_intrinsic():
    report = parse_file(FIXTURES / "synccheck_syncwarp_planted_h200.log")
    assert report.tool == "synccheck" and report.errors_reported == 32
    (f,) = report.findings
    assert f.error == "Barrier error detected. Invalid arguments." and f.count == 20
    assert f.kernel_name == "bad_syncwarp" and f.source == "planted.cu:24"
    assert f.offset == "0x70"  # of the faulting instruction, in the inlined __syncwarp


def test_one_missing_barrier_is_one_finding():
    """68 racecheck records of one removed __syncthreads (recorded on 2x H200) fold into one
    finding per kernel and kind, which lists where the others were."""
    import gzip

    from gpucheck.sanitizer.findings import sanitizer_findings

    log = FIXTURES / "racecheck_no_sync_ssim_h200x2.log.gz"
    text = gzip.decompress(log.read_bytes()).decode()
    report = parse(text, "racecheck")
    assert len(report.findings) == 68
    found = sanitizer_findings(text, "racecheck", "cuda:0", "selftest", "t")
    # racecheck names the function of the racing write: the kernel, and a device function
    # inlined into it (ChunkLoader::store, no longer "const" by a trailing qualifier)
    assert [f.kernel for f in found] == [
        "gpucheck::ssim::<unnamed>::ssim_backward_kernel<float, (bool)1>",
        "gpucheck::ssim::<unnamed>::ChunkLoader<float>::store",
    ]
    more = [int(f.evidence.split("(and ")[1].split(" ")[0]) for f in found]
    assert sum(more) + len(found) == 68
    for f in found:
        assert f.kind == "sanitizer" and f.severity == "error"
        assert "Race reported between Write access" in f.message
        assert "more record(s) of this kind in this kernel, at ssim_cuda.cu:" in f.evidence


def test_a_records_python_location_is_the_first_frame_outside_gpucheck():
    """The recorded log with the frames a watched pybind call adds (gpucheck's wrappers of
    the extension's function, torch's autograd ``apply``) between the extension and the
    user's line: the record names the user's ``forward``, not ``op_watch.py``."""
    from gpucheck._resources import PACKAGE_DIR
    from gpucheck.sanitizer.findings import sanitizer_findings

    ours = [
        f"_watched in {PACKAGE_DIR}/detectors/op_watch.py:107",
        f"<lambda> in {PACKAGE_DIR}/detectors/op_watch.py:104",
        f"wrapper in {PACKAGE_DIR}/detectors/ext_watch.py:88",
        "forward in /home/u/my_raster/__init__.py:41",
        "apply in /venv/lib/python3.12/site-packages/torch/autograd/function.py:576",
    ]
    text = UNGUARDED.read_text().replace(
        "Host Frame: <module> in unguarded_add.py:54",
        "\n=========         ".join(f"Host Frame: {f}" for f in ours)
        + "\n=========         Host Frame: <module> in unguarded_add.py:54",
    )
    first = parse(text).findings[0]
    assert first.python_frame == "/home/u/my_raster/__init__.py:41"
    assert first.python_frames[0].endswith("op_watch.py:107") and len(first.python_frames) == 6
    [f, *_] = sanitizer_findings(text, "memcheck", "cuda:1", "s", "t.py::x")
    assert "(from /home/u/my_raster/__init__.py:41)" in f.message
    # every Python frame is gpucheck's: the innermost one is still named
    only_ours = UNGUARDED.read_text().replace("<module> in unguarded_add.py:54", ours[0])
    assert parse(only_ours).findings[0].python_frame.endswith("op_watch.py:107")


def test_a_memcheck_hint_names_the_device_guard_only_with_another_device_current():
    from gpucheck.sanitizer.findings import sanitizer_findings

    text = UNGUARDED.read_text()
    alone = sanitizer_findings(text, "memcheck", "cuda:0", "s", "t.py::x")[0]
    other = sanitizer_findings(text, "memcheck", "cuda:1", "s", "t.py::x", other_current=True)[0]
    assert "guard" not in alone.hint and "bounds" in alone.hint
    assert "missing device guard" in other.hint


@pytest.mark.parametrize(
    ("log", "line"),
    [
        ("memcheck_oob_pybind_watched_h200x2.log", "test_selftest.py:67"),
        ("memcheck_shared_oob_ssim_watched_h200x2.log", "test_defect_ssim.py:33"),
    ],
)
def test_a_recorded_watched_call_is_located_at_the_tests_line(log, line):
    """Real records of calls made through gpucheck's watch: compute-sanitizer names the
    Python files without their folders, gpucheck's wrappers and torch's ``_ops.py`` first.
    Before, every such record said ``(from op_watch.py:109)``."""
    from gpucheck.sanitizer.findings import sanitizer_findings

    text = (FIXTURES / log).read_text()
    first = parse(text).findings[0]
    assert first.python_frames[0].split(":")[0] in ("op_watch.py", "_ops.py")
    assert first.python_frame == line
    f = sanitizer_findings(text, "memcheck", "cuda:0", "s", "t.py::x")[0]
    assert f"(from {line})" in f.message and "op_watch" not in f.message


def test_the_records_a_tool_did_not_print_are_counted_from_its_summary():
    from gpucheck.sanitizer.findings import dropped_finding

    text = (FIXTURES / "initcheck_uninit_planted_h200.log").read_text()  # --print-limit 20
    f = dropped_finding([text], "cuda:0", "s", "t.py::x")
    assert (f.kind, f.severity, f.case) == ("sanitizer-limit", "warning", "t.py::x")
    assert "980 more record(s) it counted were not printed" in f.message
    clean = (FIXTURES / "racecheck_race_planted_h200.log").read_text()  # printed them all
    assert dropped_finding([clean], "cuda:0", "s", "t.py::x") is None
    cut = text.split("========= ERROR SUMMARY")[0]  # the tool died before its summary
    assert "an unknown number" in dropped_finding([cut], "cuda:0", "s", "t.py::x").message
