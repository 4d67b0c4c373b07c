"""wrong-stream on a pybind11 extension called from an ``autograd.Function`` (the self-test's
suites/selftest/pybind_defects.*): its functions' kernels judged per call under
``module.function`` with the Python line of the call, and kernels that no watched call
launched judged at case level with their library.

Fixtures: tests/fixtures/launches/pybind_*.json were recorded on one H100 (torch
2.11.0+cu130, 2026-11-25) by ``tests/fixtures/launches/record_pybind_traces.py`` (then run by
``benchmarks/gpu_pybind.sh``, now ``tools/gpu record``); a fixture built by hand in the same
format must say so in its ``"synthetic"`` field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpucheck.detectors import CaseInfo
from gpucheck.detectors.launch_windows import Window, attribute, candidates, judge, unclaimed
from gpucheck.detectors.wrong_stream import findings, misplaced, unclaimed_findings

FIXTURES = Path(__file__).parents[1] / "fixtures" / "launches"
CASE = CaseInfo("cuda:0", "selftest", "test_defect_pybind.py::test_x[cuda0]")
SCENARIOS = (
    "pybind_clean",
    "pybind_legacy_stream",
    "pybind_cub_stream0",
    "pybind_unwatched_caller",
)


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def windows(name: str) -> list[Window]:
    return [
        Window(
            w["events"],
            w["log"],
            {int(k): v for k, v in w["streams"].items()},
            w.get("libraries", {}),
            w.get("unwatched", []),
        )
        for w in load(name)["windows"]
    ]


def wrong_stream(name: str) -> list:
    ws = windows(name)
    return findings(CASE, misplaced(ws, "wrong-stream")) + unclaimed_findings(CASE, ws)


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_window_holds_the_forward_and_autograds_backward_call(name):
    """One window per scenario: the forward call (from ``Scale.forward``) kept it open until
    the backward that autograd ran (from ``Scale.backward``, on its own thread)."""
    ws = windows(name)
    assert len(ws) == 1
    calls = {
        (lc.op.rsplit(".", 1)[1], lc.frame.rsplit(" in ", 1)[1])
        for lc in attribute(ws[0].events, ws[0].log)
    }
    assert calls == {("scale_forward", "Scale.forward"), ("scale_backward", "Scale.backward")}
    assert all("pybind_defects.py:" in e["frame"] for e in ws[0].log if e["edge"] != "legacy")
    assert [e["edge"] for e in ws[0].log].count("legacy") == 1  # stream 0 named once


def test_the_clean_build_draws_no_finding():
    assert wrong_stream("pybind_clean") == []
    # its ctypes launch ran unclaimed, on the caller's current stream: not even a candidate
    [w] = windows("pybind_clean")
    assert candidates(w.events, w.log) == [] and unclaimed(w) == []


def test_forward_on_stream0_is_named_by_its_function_and_line():
    found = wrong_stream("pybind_legacy_stream")
    assert {f.op for f in found} == {"gpucheck_pybind_legacy_stream.scale_forward"}
    (f,) = found
    assert "scale_kernel" in f.kernel and f.kind == "wrong-stream" and f.severity == "error"
    assert "called from suites/selftest/pybind_defects.py:" in f.message
    assert f.message.endswith("in Scale.forward)")


def test_cub_on_stream0_in_autograds_backward_is_named():
    found = wrong_stream("pybind_cub_stream0")
    assert {f.op for f in found} == {"gpucheck_pybind_cub_stream0.scale_backward"}
    assert all("cub::" in f.kernel and "Reduce" in f.kernel for f in found)
    assert all(f.message.endswith("in Scale.backward)") for f in found)
    assert all("scale_backward_kernel" not in f.kernel for f in found)  # that one was right


def test_a_kernel_no_watched_call_launched_is_named_with_its_library():
    (f,) = wrong_stream("pybind_unwatched_caller")
    assert f.op is None and "scale_kernel" in f.kernel
    assert "of gpucheck_pybind_clean.so ran on cuda:0" in f.message
    assert "(the legacy default stream)" in f.message and "no watched call" in f.message
    [w] = windows("pybind_unwatched_caller")
    assert judge(attribute(w.events, w.log)) == []  # every watched call was right


def _with_unclaimed(name: str, stream: int, library: str | None) -> Window:
    """The clean window plus one kernel after the forward call, outside every call."""
    [w] = windows("pybind_clean")
    last = max(e["correlation"] for e in w.events)  # after the last call's end marker
    extra = {"name": name, "type": "kernel", "device": 0, "stream": stream, "correlation": last + 1}
    return Window([*w.events, extra], w.log, w.streams, {name: library} if library else {}, [])


def _streams() -> tuple[int, int]:
    """(the legacy default stream's id, the current stream's id) of the clean window, from
    its markers (one per log entry, in order)."""
    [w] = windows("pybind_clean")
    markers = [e for e in w.events if "spin_kernel" in e["name"]]
    by_edge = {e["edge"]: m["stream"] for m, e in zip(markers, w.log, strict=True)}
    return by_edge["legacy"], by_edge["begin"]


@pytest.mark.parametrize(
    "kernel",
    [
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
        "ampere_sgemm_128x64_nn",
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(int)",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<int>(int)",
    ],
)
def test_torchs_own_kernels_on_stream0_are_never_unclaimed(kernel):
    legacy, _ = _streams()
    assert unclaimed(_with_unclaimed(kernel, legacy, None)) == []


def test_an_unknown_kernel_counts_on_stream0_only():
    legacy, _ = _streams()
    name = "void my_raster::render_kernel<at::Half>(at::Half const*)"  # not torch's: its args
    (u,) = unclaimed(_with_unclaimed(name, legacy, None))
    assert (u.kernel, u.library, u.legacy) == (name, None, True)
    (f,) = unclaimed_findings(CASE, [_with_unclaimed(name, legacy, None)])
    assert "not found among the compiled torch extensions" in f.evidence
    assert unclaimed(_with_unclaimed(name, 29, None)) == []  # a private stream: can't tell
    lib = "/x/my_raster/_C.so"
    (u,) = unclaimed(_with_unclaimed(name, 29, lib))  # in an extension's library: it counts
    assert (u.library, u.legacy, u.ran_on) == (lib, False, (29,))
    w = _with_unclaimed(name, 29, lib)
    w.unwatched = [lib]  # its module opted out
    assert unclaimed(w) == []


def test_a_kernel_on_the_current_stream_is_never_unclaimed():
    _, current = _streams()
    assert unclaimed(_with_unclaimed("void my::k(int)", current, "/x/_C.so")) == []


def test_the_fixtures_say_whether_they_were_recorded():
    for name in SCENARIOS:
        data = load(name)
        assert bool(data.get("synthetic")) != bool(data.get("recorded_on")), name
    readme = (FIXTURES / "README.md").read_text()
    assert all(f"`{name}.json`" in readme for name in SCENARIOS)


def test_library_paths_are_named_by_file():
    [w] = windows("pybind_unwatched_caller")
    (lib,) = {v for v in w.libraries.values() if v}
    assert os.path.basename(lib) == "gpucheck_pybind_clean.so"


#: host-stub symbols nvcc 13.0 wrote for suites/selftest/pybind_defects.cu (``nm``, built with
#: -DTORCH_EXTENSION_NAME=gpucheck_pybind_clean), and what gcc writes for the same namespace
NVCC_SYMBOLS = (
    b"_ZN21gpucheck_pybind_clean50_GLOBAL__N__37bc63fb_17_pybind_defects_cu_842a08541"
    b"2scale_kernelEPKfS2_Pfl\0_ZN21gpucheck_pybind_clean50_GLOBAL__N__37bc63fb_17_p"
    b"ybind_defects_cu_842a085412shade_kernelEPKfS2_fPfll\0"
    b"_ZN21gpucheck_pybind_clean12_GLOBAL__N_16helperEv\0_Z5scaleRKN2at6TensorEd"
)


@pytest.mark.parametrize(
    ("kernel", "found"),
    [
        (
            "gpucheck_pybind_clean::(anonymous namespace)::scale_kernel("
            "float const*, float const*, "
            "float*, long)",
            True,
        ),
        (
            "gpucheck_pybind_clean::(anonymous namespace)::shade_kernel("
            "float const*, float const*, "
            "float, float*, long, long)",
            True,
        ),
        ("void gpucheck_pybind_clean::(anonymous namespace)::helper<float>()", True),  # gcc's form
        ("gpucheck_pybind_legacy_stream::(anonymous namespace)::scale_kernel(float const*)", False),
        ("gpucheck_pybind_clean::(anonymous namespace)::cale_kernel(float const*)", False),
        ("scale(at::Tensor const&, double)", True),
        ("_Z5scaleRKN2at6TensorEd", True),
        ("_Z5scaleRKN2at6TensorEf", False),
    ],
)
def test_a_kernel_is_found_by_its_host_stubs_symbol(kernel, found):
    from gpucheck.detectors import elf

    assert elf.matches(NVCC_SYMBOLS, elf.name_path(kernel)) is found


def test_one_bug_is_one_finding_however_many_kernels_it_launched():
    """cub's reduction on stream 0 runs two kernels (and, recorded twice over, as many again):
    one finding for the op, every kernel and its launches listed in the evidence."""
    ws = windows("pybind_cub_stream0")
    bad = misplaced(ws, "wrong-stream")
    assert len({v.kernel for v, _ in bad}) >= 2  # several kernels of the one op
    [f] = findings(CASE, bad + bad)
    assert f.op == "gpucheck_pybind_cub_stream0.scale_backward"
    assert f"{len({v.kernel for v, _ in bad})} kernels (" in f.message
    listed = f.evidence.split("its launches elsewhere:\n", 1)[1]
    assert all(v.kernel in listed for v, _ in bad)
    total = sum(v.count for v, _ in bad) * 2
    assert f"({total} launches)" in f.message
