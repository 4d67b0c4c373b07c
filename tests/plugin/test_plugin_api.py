"""The plugin's API for users' suites: xdist pinning, attached findings (plain pytest and
gpucheck run), nvml_tracker without NVML, and --suite FILE / package.module."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from clirun import gpucheck

from gpucheck import nvml
from gpucheck.controller import suites
from gpucheck.model import results
from gpucheck.model.results import Finding
from gpucheck.model.timeline import DeviceRow
from gpucheck.nvml_sampler import NvmlTracker
from gpucheck.worker import case as worker_case
from gpucheck.worker import targets

#: the environment of the gpucheck processes these tests start: gpucheck as installed, never
#: the checkout on PYTHONPATH (`nox -s package` runs these tests against an installed wheel)
ENV = dict(os.environ)


# --- pytest -n: one GPU per worker ----------------------------------------------------------


@pytest.mark.parametrize(
    ("worker", "devices", "expected"),
    [
        ("gw0", [0, 1], 0),
        ("gw1", [0, 1], 1),
        ("gw2", [0, 1], 0),
        ("gw7", [0, 1, 2], 1),
        ("gw3", [4, 6], 6),
        ("gw12", list(range(8)), 4),
    ],
)
def test_xdist_workers_are_pinned_round_robin(worker, devices, expected):
    assert targets.pinned_device(worker, devices) == expected


def test_an_unexpected_worker_id_is_a_usage_error():
    with pytest.raises(pytest.UsageError, match="cannot pin xdist worker 'main'"):
        targets.pinned_device("main", [0])


def test_an_inherited_worker_variable_alone_does_not_pin(monkeypatch, pytestconfig):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert targets.xdist_worker(pytestconfig) == (
        "gw1" if hasattr(pytestconfig, "workerinput") else None
    )


def test_pytest_n_pins_each_worker_to_one_device_with_the_same_ids(pytester, monkeypatch, tmp_path):
    # three "GPUs": the device count and the fixture's CUDA part are replaced, the
    # parametrization and the pinning are the plugin's
    pins = tmp_path / "pins.txt"
    monkeypatch.setenv("PINS", str(pins))
    pytester.makeconftest("""
        import pytest
        from gpucheck.worker import targets
        targets.visible_cuda_count = lambda: 3
        @pytest.fixture
        def gpu_device(request):
            return request.param
    """)
    pytester.makepyfile(
        test_pin="""
        import os, pytest
        @pytest.mark.parametrize("i", range(12))
        def test_where(gpu_device, i):
            with open(os.environ["PINS"], "a") as f:
                f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '-')} {gpu_device}\\n")
    """
    )
    result = pytester.runpytest_subprocess("-n", "2", "-v")
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines(["*PASSED*test_where?gpu-0?*"])  # the same ids on every worker
    assert {tuple(line.split()) for line in pins.read_text().splitlines()} == {
        ("gw0", "0"),
        ("gw1", "1"),
    }
    # without xdist: one case per device
    pytester.runpytest_subprocess("-k", "where and 3").assert_outcomes(passed=3)


# --- a CUDA context lost under plain pytest --------------------------------------------------

LOST_CONFTEST = """
    import pytest
    from gpucheck.worker import targets
    targets.visible_cuda_count = lambda: 1
    @pytest.fixture
    def gpu_device(request):
        return request.param
"""
LOST_SUITE = """
    import pytest
    def test_a_faults(gpu_device):
        try:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\\n"
                               "Compile with TORCH_USE_CUDA_DSA to enable device-side assertions.")
        except RuntimeError as err:
            raise AssertionError("the op failed") from err
    def test_b_later(gpu_device):
        pass
    @pytest.mark.gpu
    def test_c_marked():
        pass
    def test_d_cpu_only():
        pass
"""


@pytest.mark.parametrize("xdist", [False, True], ids=["plain", "xdist"])
def test_after_a_sticky_cuda_error_later_cuda_tests_say_not_run(pytester, xdist):
    pytester.makeconftest(LOST_CONFTEST)
    pytester.makepyfile(test_lost=LOST_SUITE)
    result = pytester.runpytest_subprocess(*(("-n", "1") if xdist else ()), "-p", "no:randomly")
    # the faulting test fails; the later CUDA tests error in setup, naming it; CPU ones run
    result.assert_outcomes(failed=1, errors=2, passed=1)
    case = "test_lost.py::test_a_faults?" + ("gpu?" if xdist else "cuda0?")  # fnmatch: [ ]
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_b_later*",
            f"not run: this process's CUDA context was lost in {case} (CUDA error: an illegal "
            "memory access was encountered); every later CUDA call in the process fails the same "
            "way*",
            "*ERROR at setup of test_c_marked*",
            "*gpucheck: CUDA context lost*",
            f"{case} lost its process's CUDA context: 2 later test(s) of that process were not "
            "run*",
        ]
    )


def test_a_non_sticky_cuda_error_does_not_stop_later_tests(pytester):
    pytester.makeconftest(LOST_CONFTEST)
    pytester.makepyfile(
        test_oom="""
        def test_a_oom(gpu_device):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        def test_b_invalid(gpu_device):  # torch's whole message, its DSA hint included
            raise RuntimeError(
                "CUDA error: invalid argument\\n"
                "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\\n"
                "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
        def test_c_later(gpu_device):
            pass
    """
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=2, passed=1)
    assert "context lost" not in result.stdout.str()


def test_sticky_cuda_error_reads_the_chain_and_names_the_line():
    try:
        try:
            raise RuntimeError(
                "CUDA kernel errors might be asynchronously reported\n"
                "CUDA error: device-side assert triggered"
            )
        except RuntimeError:
            raise AssertionError("wrapped") from None  # suppressed, still the context
    except AssertionError as err:
        assert worker_case.sticky_cuda_error(err) == "CUDA error: device-side assert triggered"
    assert worker_case.sticky_cuda_error(RuntimeError("CUDA out of memory")) is None
    assert worker_case.sticky_cuda_error(ValueError("bad shape")) is None


# --- attached findings ----------------------------------------------------------------------


def test_merge_names_the_op_and_leaves_out_what_the_detectors_found():
    detector = [
        Finding("numerics", "error", "mismatch against the reference: x"),
        Finding("device-state-leak", "warning", "the current device changed"),
    ]
    mine = [
        Finding("numerics", "error", "mismatch against the reference: x", op="ext.f"),
        Finding("numerics", "error", "non-deterministic", op="ext.f"),
        Finding("device-state-leak", "warning", "ext.f: forward changed it", op="ext.f"),
        Finding("wrong-device", "error", "ext.f: output 0 on cuda:1", op="ext.f"),
    ]
    kept = worker_case.merge(detector, mine, "ext.f")
    assert [f.message for f in kept] == ["non-deterministic", "ext.f: output 0 on cuda:1"]
    assert all(f.op == "ext.f" for f in detector)


def test_attach_refuses_a_bad_severity():
    with pytest.raises(ValueError, match="severity must be error, warning or info"):
        worker_case.attach("numerics", "x", severity="fatal")


FINDINGS_SUITE = """
    def test_attaches(gpucheck_findings):
        gpucheck_findings.attach("numerics", "off by 3 ulp", op="ext::f", hint="look")
    def test_warns(gpucheck_findings):
        gpucheck_findings.attach("slow", "took long", severity="warning")
    def test_clean():
        pass
"""


def test_attached_findings_under_plain_pytest_fail_the_session(pytester):
    pytester.makepyfile(test_f=FINDINGS_SUITE)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=3)
    assert result.ret == 1  # an error finding, although every test passed
    result.stdout.fnmatch_lines(
        [
            "*gpucheck findings*",
            "ERROR numerics ?op ext::f? test_f.py::test_attaches: off by 3 *",
            "    hint: look",
            "WARNING slow ?? test_f.py::test_warns: took long",
        ]
    )
    assert pytester.runpytest_subprocess("-k", "warns or clean").ret == 0


def test_attached_findings_go_into_the_case_record_under_gpucheck_run(tmp_path):
    suite = tmp_path / "mine"
    suite.mkdir()
    (suite / "test_f.py").write_text(textwrap.dedent(FINDINGS_SUITE))
    out = tmp_path / "out"
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--quiet",
        "--suite",
        str(suite),
        "--out",
        str(out),
        cwd=tmp_path,
        timeout=180,
        env=ENV,
    )
    assert proc.returncode == 1, proc.stderr  # findings of severity error
    recs = {r["case"]: r for r in results.cases(out / "results.jsonl")}
    found = recs["test_f.py::test_attaches"]["findings"]
    assert [(f["kind"], f["op"], f["device"], f["suite"], f["case"]) for f in found] == [
        ("numerics", "ext::f", "cpu", "mine", "test_f.py::test_attaches")
    ]
    assert recs["test_f.py::test_attaches"]["status"] == "passed"
    assert [f["severity"] for f in recs["test_f.py::test_warns"]["findings"]] == ["warning"]
    assert recs["test_f.py::test_clean"]["findings"] == []


def test_a_failure_that_repeats_an_attached_finding_is_one_finding_under_gpucheck_run(tmp_path):
    # check_op attaches its finding, then raises with the same text: one finding, which keeps
    # the failure's evidence; a failure that says something else stays a finding of its own
    suite = tmp_path / "mine"
    suite.mkdir()
    (suite / "test_f.py").write_text(
        textwrap.dedent("""
        def test_twice(gpucheck_findings):
            gpucheck_findings.attach("numerics", "mismatch against the reference: ext.f "
                                     "output 0: 3 of 8 elements out of tolerance", op="ext.f")
            raise AssertionError("ext.f output 0: 3 of 8 elements out of tolerance")
        def test_other(gpucheck_findings):
            gpucheck_findings.attach("numerics", "ext.f: 1 ulp off", severity="warning")
            assert 1 == 2
        def test_quoted_cuda_error(gpucheck_findings):
            msg = ("ext.f: dtype coverage broken for float16: wrong-error (error does not "
                   "name float16: CUDA error: device-side assert triggered)")
            gpucheck_findings.attach("numerics", msg, op="ext.f")
            raise AssertionError(msg)
        def test_z_after():
            pass
    """)
    )
    out = tmp_path / "out"
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--quiet",
        "--suite",
        str(suite),
        "--out",
        str(out),
        cwd=tmp_path,
        timeout=180,
        env=ENV,
    )
    assert proc.returncode == 1, proc.stderr
    recs = {r["case"]: r for r in results.cases(out / "results.jsonl")}
    twice = recs["test_f.py::test_twice"]
    assert twice["status"] == "failed"
    (f,) = twice["findings"]
    assert (f["kind"], f["op"]) == ("numerics", "ext.f")
    assert "raise AssertionError" in f["evidence"]  # the failure's traceback
    assert sorted(f["kind"] for f in recs["test_f.py::test_other"]["findings"]) == [
        "numerics",
        "test-failure",
    ]
    # a CUDA error stays a cuda-error finding, and the lost context still ends the worker
    assert sorted(f["kind"] for f in recs["test_f.py::test_quoted_cuda_error"]["findings"]) == [
        "cuda-error",
        "numerics",
    ]
    assert (out / "workers" / "cpu.blocking.1.cmd").exists()
    assert recs["test_f.py::test_z_after"]["status"] == "passed"


# --- nvml_tracker ---------------------------------------------------------------------------


def test_nvml_tracker_without_nvml_is_not_available_and_says_why(monkeypatch):
    monkeypatch.setattr(nvml, "status", lambda: nvml.NvmlStatus(False, "no driver here"))
    tracker = NvmlTracker().start()
    tracker.stop()
    assert not tracker.available and tracker.reason == "no driver here"
    assert tracker.peak() is nvml.NA and tracker.peaks() == {} and tracker.timeline == []


def test_nvml_tracker_keeps_this_processes_memory_per_device():
    tracker = NvmlTracker.__new__(NvmlTracker)
    tracker.timeline, tracker.available = [], True
    import threading

    tracker._lock = threading.Lock()
    me, other = str(os.getpid()), "1"
    tracker._on_sample(
        1.0,
        [
            DeviceRow(None, "GPU-a", None, {me: 100, other: 900}),
            DeviceRow(None, "GPU-b", None, {other: 5}),
        ],
    )
    tracker._on_sample(
        2.0, [DeviceRow(None, "GPU-a", None, {me: 300}), DeviceRow(None, "GPU-b", None, {me: 7})]
    )
    assert tracker.timeline == [(1.0, {"GPU-a": 100}), (2.0, {"GPU-a": 300, "GPU-b": 7})]
    assert tracker.peak() == 300 and tracker.peak("GPU-b") == 7
    assert tracker.peaks() == {"GPU-a": 300, "GPU-b": 7}


def test_the_nvml_tracker_fixture_works_without_a_gpu(pytester):
    pytester.makepyfile(
        test_n="""
        from gpucheck import nvml
        def test_memory(nvml_tracker, record_property):
            if not nvml_tracker.available:
                assert nvml_tracker.peak() is nvml.NA and nvml_tracker.reason
            else:
                assert nvml_tracker.peak() >= 0
    """
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


# --- --suite FILE and --suite package.module ------------------------------------------------


def _package(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "myext" / "tests"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "test_ops.py").write_text("def test_a():\n    pass\ndef test_b():\n    pass\n")
    return tmp_path / "site"


def test_module_path_finds_modules_and_packages(tmp_path, monkeypatch):
    site = _package(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    assert suites.module_path("myext.tests.test_ops") == site / "myext/tests/test_ops.py"
    assert suites.module_path("myext.tests") == site / "myext/tests"
    assert suites.module_path("myext.nothing") is None
    assert suites.module_path("not a module") is None
    assert suites.resolve(["myext.tests"]) == {"myext.tests": site / "myext/tests"}


@pytest.mark.parametrize("how", ["module", "file"])
def test_gpucheck_run_takes_a_module_or_a_test_file(tmp_path, how):
    site = _package(tmp_path)
    target = (
        "myext.tests.test_ops" if how == "module" else str(site / "myext" / "tests" / "test_ops.py")
    )
    out = tmp_path / "out"
    env = {
        **ENV,
        "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [ENV.get("PYTHONPATH")])]),
    }
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--quiet",
        "--suite",
        target,
        "--out",
        str(out),
        cwd=tmp_path,
        timeout=180,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = list(results.cases(out / "results.jsonl"))
    assert sorted(r["case"] for r in recs) == ["test_ops.py::test_a", "test_ops.py::test_b"]
    assert {r["suite"] for r in recs} == {"myext.tests.test_ops" if how == "module" else "test_ops"}
    json.dumps(recs)


def test_an_unknown_suite_names_every_form(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from gpucheck.errors import UsageProblem

    with pytest.raises(
        UsageProblem,
        match=r"no file or folder of that name here, not one of "
        r"the known suites .*, and not an importable "
        r"module",
    ):
        suites.resolve(["no_such.module_here"])


@pytest.mark.parametrize(
    ("asked", "missing"),
    [
        ("tests/test_my_ext.py", "tests"),  # the folder is missing: named, not the file
        ("test_my_ext.py", "test_my_ext.py"),
        ("suites/mine/", "suites"),
    ],
)
def test_a_suite_path_that_does_not_exist_names_what_is_missing(
    tmp_path, monkeypatch, asked, missing
):
    monkeypatch.chdir(tmp_path)
    from gpucheck.errors import UsageProblem

    with pytest.raises(UsageProblem) as err:
        suites.resolve([asked])
    assert str(err.value) == (f"suite {asked!r} does not exist: there is no {tmp_path / missing}")
