"""The memory detectors on CPU: the OOM parser on messages recorded on an H200
(tests/fixtures/oom/, README there) and torch's older wordings, anomalies and growth over case
records, imbalance across devices, the leak judgement and the repeat marker in a real worker,
and the run-level wiring (pipeline._diagnose)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from gpucheck.checkpoints.detectors import DoubleActivation
from gpucheck.controller import pipeline
from gpucheck.detectors import CaseInfo, Leak, worker_detectors
from gpucheck.detectors.imbalance import imbalances
from gpucheck.detectors.leak import judge
from gpucheck.detectors.memory_growth import growth, size_of
from gpucheck.detectors.oom_anomaly import oom_findings, parse_memory_anomaly, parse_oom
from gpucheck.model import results
from gpucheck.model.results import CaseRecord

OOM = Path(__file__).parent / "fixtures" / "oom"
GiB, MiB = 1 << 30, 1 << 20
CASE = CaseInfo("cuda:0", "s", "test_x.py::test_x[cuda0]")


def recorded(kind: str) -> str:
    return (OOM / f"{kind}.txt").read_text()


def failed(
    message: str,
    memory: dict | None = None,
    device: str = "cuda:0",
    case: str = "test_m.py::test_m[cuda0]",
    traceback: str = "",
) -> CaseRecord:
    """A case record as the worker writes it for a case that raised ``message``, read back."""
    head = message.splitlines()[0]
    return read_back(
        {
            "record": "case",
            "device": device,
            "suite": "s",
            "case": case,
            "mode": "blocking+nvml",
            "status": "failed",
            "memory": memory or {"torch_peak_allocated": 300 * MiB},
            "findings": [
                {
                    "kind": "test-failure",
                    "severity": "error",
                    "message": head,
                    "evidence": f"{traceback}\nE   {message}\n\ntest_m.py:12: {head.split(':')[0]}",
                }
            ],
        }
    )


def read_back(record: dict) -> CaseRecord:
    """A record as the controller reads it back from results.jsonl."""
    found = CaseRecord.from_json({"run_id": "r", **record})
    assert found is not None
    return found


# --- the parser ------------------------------------------------------------------------------

# torch 2.0's wording (c10/cuda/CUDACachingAllocator.cpp of v2.0.0), as users paste it; story 3
STORY3_TORCH20 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 52.32 GiB (GPU 0; "
    "23.68 GiB total capacity; 2.10 GiB already allocated; 20.87 GiB free; 2.14 GiB reserved "
    "in total by PyTorch) If reserved memory is >> allocated memory try setting "
    "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
    "PYTORCH_CUDA_ALLOC_CONF"
)
# torch 2.1's wording (v2.1.0, "capacty" misspelled there), with another process on the GPU
TORCH21 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
    "total capacty of 15.77 GiB of which 4.12 MiB is free. Process 16183 has 15.76 GiB memory "
    "in use. Of the allocated memory 15.31 GiB is allocated by PyTorch, and 88.22 MiB is "
    "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
    "setting max_split_size_mb to avoid fragmentation.  See documentation for Memory "
    "Management and PYTORCH_CUDA_ALLOC_CONF"
)


def test_torch20_wording():
    m = parse_oom(STORY3_TORCH20)
    assert m is not None and m.gpu == 0
    assert m.requested == round(52.32 * GiB) and m.total == round(23.68 * GiB)
    assert m.allocated == round(2.10 * GiB) and m.free == round(20.87 * GiB)
    assert m.reserved == round(2.14 * GiB)
    assert m.unallocated == round(2.14 * GiB) - round(2.10 * GiB)


def test_torch21_wording():
    m = parse_oom(TORCH21)
    assert m is not None and m.total == round(15.77 * GiB) and m.free == round(4.12 * MiB)
    assert m.allocated == round(15.31 * GiB) and m.reserved_unallocated == round(88.22 * MiB)


def test_recorded_torch211_wordings():
    huge = parse_oom(recorded("huge_request"))
    assert huge is not None and huge.gpu == 0
    assert (huge.requested, huge.total, huge.free) == (
        round(279.60 * GiB),
        round(139.80 * GiB),
        round(138.95 * GiB),
    )
    assert (huge.process_in_use, huge.allocated, huge.reserved_unallocated) == (
        866 * MiB,
        256 * MiB,
        0,
    )
    frag = parse_oom(recorded("fragmentation"))
    assert frag is not None and frag.allowed == 24 * GiB
    assert frag.allocated == round(7.60 * GiB) and frag.unallocated == round(8.40 * GiB)
    assert frag.reserved == round(7.60 * GiB) + round(8.40 * GiB)
    cap = parse_oom(recorded("process_fraction"))
    assert cap is not None and (cap.requested, cap.allowed) == (3 * GiB, 4 * GiB)
    exp = parse_oom(recorded("huge_request_expandable"))
    assert exp is not None and exp.reserved_unallocated == 4 * MiB


def test_recorded_traceback_and_raw_cuda_oom():
    tb = parse_oom((OOM / "huge_request.traceback.txt").read_text())
    assert tb is not None and tb.requested == round(279.60 * GiB)
    raw = parse_oom((OOM / "huge_request_no_caching.stderr_tail.txt").read_text())
    assert raw is not None and raw.requested is None and "CUDA error: out of memory" in raw.text


@pytest.mark.parametrize(
    ("kind", "want"),
    [
        ("huge_request", ("oom-anomaly", "error", "279.60 GiB on a device of 139.80 GiB")),
        ("huge_request_expandable", ("oom-anomaly", "error", "2.0x the whole device")),
        ("fragmentation", ("oom", "warning", "8.40 GiB reserved by PyTorch but unallocated")),
        ("process_fraction", ("oom", "info", "the process limited to 4.00 GiB")),
        ("many_small_until_full", ("oom", "info", "0.06 GiB requested")),
    ],
)
def test_recorded_messages_as_case_failures(kind, want):
    tb = (OOM / f"{kind}.traceback.txt").read_text()
    [f] = oom_findings([failed(f"torch.OutOfMemoryError: {recorded(kind)}", traceback=tb)])
    assert (f.kind, f.severity) == want[:2] and want[2] in f.message, f.message


def test_recorded_raw_cuda_oom_as_cuda_error():
    text = (OOM / "huge_request_no_caching.stderr_tail.txt").read_text()
    rec = failed("torch.AcceleratorError: CUDA error: out of memory", traceback=text)
    rec.findings[0].kind = "cuda-error"
    [f] = oom_findings([rec])
    assert (f.kind, f.severity) == ("oom", "info") and "no sizes" in f.message


def test_not_an_oom():
    assert parse_oom("AssertionError: Tensor-likes are not close!") is None
    assert parse_memory_anomaly("RuntimeError: CUDA error: an illegal memory access") is None


def test_size_parameters():
    assert [size_of(t) for t in ("4096", "n4096", "n=64", "1920x1080", "cuda0", "fp16")] == [
        4096,
        4096,
        64,
        1920 * 1080,
        None,
        None,
    ]


# --- anomalies at the failure ----------------------------------------------------------------


def test_story3_request_beyond_the_device_is_an_anomaly():
    [f] = oom_findings([failed(STORY3_TORCH20)])
    assert (f.kind, f.severity) == ("oom-anomaly", "error")
    assert "52.32 GiB on a device of 23.68 GiB" in f.message and "2.2x" in f.message
    assert "activated twice" in (f.hint or "") and "requested=" in (f.evidence or "")


def test_reruns_of_the_wrong_device_check_are_not_counted_twice():
    rerun = replace(failed(STORY3_TORCH20), mode="blocking+nvml|rerun:target-current")
    assert len(oom_findings([failed(STORY3_TORCH20), rerun])) == 1


def test_request_far_beyond_the_footprint():
    msg = (
        TORCH21.replace("Tried to allocate 20.00 MiB", "Tried to allocate 9.00 GiB")
        .replace("15.77 GiB", "79.11 GiB")
        .replace("15.31 GiB is allocated", "0.25 GiB is allocated")
    )
    [f] = oom_findings([failed(msg, {"torch_peak_allocated": 256 * MiB})])
    assert f.kind == "oom-anomaly" and "the case's measured footprint" in f.message


def test_small_oom_with_larger_holes_is_fragmentation():
    [f] = oom_findings([failed(TORCH21)])  # 88.22 MiB in holes, 20 MiB requested
    assert (f.kind, f.severity) == ("oom", "warning") and "fragmentation" in f.message


@pytest.mark.parametrize("kind", ["memory_anomaly_max_bytes", "memory_anomaly_free_memory"])
def test_rasterizer_memory_anomaly_error(kind):
    text = f"gpucheck.errors.MemoryAnomalyError: {recorded(kind)}"
    a = parse_memory_anomaly(text)
    assert a is not None and a.overlaps and a.bytes_needed and a.radius_percentiles
    assert a.share_huge == 1.0 and (a.hint or "").startswith("scales look already")
    [f] = oom_findings([failed(text, traceback="    raise MemoryAnomalyError(msg)")])
    assert (f.kind, f.severity) == ("oom-anomaly", "error")
    assert f"{a.overlaps:,} tiles" in f.message and "100%" in f.message
    assert f.hint == a.hint


# --- growth over sizes -------------------------------------------------------------------------


def sized(n: int, peak: int, device: str = "cuda:0", name: str = "test_g") -> CaseRecord:
    dev = device.replace(":", "")
    return read_back(
        {
            "record": "case",
            "device": device,
            "suite": "s",
            "mode": "blocking+nvml",
            "case": f"test_g.py::{name}[{dev}-{n}]",
            "status": "passed",
            "memory": {"torch_peak_allocated": peak},
            "findings": [],
        }
    )


def test_quadratic_growth_is_flagged_linear_is_not():
    quad = [sized(n, 4 * n * n + 4 * n) for n in (1024, 2048, 4096)]
    lin = [sized(n, 8 * n, name="test_l") for n in (1 << 20, 1 << 21, 1 << 22)]
    reps = [sized(n, 132096, name="test_rep") for n in (0, 1, 2)]
    [f] = growth(quad + lin + reps)
    assert (f.kind, f.severity) == ("memory-growth", "warning")
    assert f.case == "test_g.py::test_g[cuda0-4096]" and "size^2.00" in f.message


def test_growth_is_fitted_on_the_cases_own_peak():
    """The peaks the self-test's quadratic scratch recorded on an H200 (2026-11-24) with
    84 MiB left allocated by earlier cases: absolute peaks grow as size^1.17 only, the
    case's own (peak - allocated at its start) as size^2."""
    at_start = 84 * (1 << 20)
    recs = [sized(n, at_start + 4 * n * n) for n in (1024, 2048, 4096)]
    for r in recs:
        r.memory["torch_allocated_at_start"] = at_start
    [f] = growth(recs)
    assert "size^2.00" in f.message and "4,096: 64.0 MiB" in f.message
    for r in recs:
        del r.memory["torch_allocated_at_start"]
    assert growth(recs) == []  # what the detector saw before it subtracted the start


def test_linear_shapes_far_apart_are_not_extrapolated():
    """The SSIM suite's image sizes on an H200 (2026-11-24): linear, but from 137,634 to
    31,104,000 elements; the same step again would be 1.6 TiB: not a prediction to make."""
    mib = 1 << 20
    recs = [sized(n, int(p * mib)) for n, p in ((121, 0.01), (137_634, 17.3), (31_104_000, 3924.2))]
    assert growth(recs, {"cuda:0": 140 * GiB}) == []


def test_growth_beyond_the_device_is_an_error():
    recs = [sized(n, 4 * n * n) for n in (16384, 32768, 65536)]  # 16 GiB at 65536
    [f] = growth(recs, {"cuda:0": 48 * GiB})  # 64 GiB predicted at 131072
    assert f.severity == "error" and "more than the device's 48.00 GiB" in f.message
    assert growth(recs[:2], {"cuda:0": 48 * GiB})[0].severity == "warning"  # 16 GiB next


# --- imbalance ---------------------------------------------------------------------------------


def peak(
    device: str,
    torch_peak: int,
    nvml_peak: int,
    case: str = "test_i.py::test_i[{d}]",
    reserved: int | None = None,
) -> CaseRecord:
    memory = {"torch_peak_allocated": torch_peak, "nvml_peak_used": nvml_peak}
    if reserved is not None:
        memory["torch_peak_reserved"] = reserved
    return read_back(
        {
            "record": "case",
            "device": device,
            "suite": "s",
            "mode": "blocking+nvml",
            "case": case.format(d=device.replace(":", "")),
            "status": "passed",
            "memory": memory,
        }
    )


def test_imbalance_across_devices():
    recs = [
        peak("cuda:0", 900 * MiB, 1500 * MiB),
        peak("cuda:1", 100 * MiB, 700 * MiB),
        peak("cuda:0", 100 * MiB, 700 * MiB, "test_i.py::test_ok[{d}]"),
        peak("cuda:1", 110 * MiB, 720 * MiB, "test_i.py::test_ok[{d}]"),
    ]
    [f] = imbalances(recs)
    assert (f.kind, f.severity, f.device) == ("imbalance", "warning", "cuda:0")
    assert f.case == "test_i.py::test_i[cuda0]" and "800.0 MiB more than cuda:1" in (
        f.evidence or ""
    )
    assert imbalances([r for r in recs if r.device == "cuda:0"]) == []


def test_imbalance_leaves_out_the_pool_earlier_cases_reserved():
    # A resumed worker ran this case with 10 GB still reserved by the cases before it; the
    # first run's worker had released none of it yet: the same allocations, NVML apart by GB.
    GiB = 1024 * MiB
    recs = [
        peak("cuda:0", 40 * MiB, 10 * GiB + 700 * MiB, reserved=10 * GiB),
        peak("cuda:1", 40 * MiB, 700 * MiB, reserved=64 * MiB),
    ]
    assert imbalances(recs) == []
    # memory outside the pool (a raw cudaMalloc, a second context) still counts
    recs = [
        peak("cuda:0", 40 * MiB, 10 * GiB + 1700 * MiB, reserved=10 * GiB),
        peak("cuda:1", 40 * MiB, 700 * MiB, reserved=64 * MiB),
    ]
    [f] = imbalances(recs)
    assert f.device == "cuda:0" and "outside PyTorch's reserved pool" in (f.evidence or "")


# --- leak ----------------------------------------------------------------------------------------


def test_leak_judgement():
    flat = [1000] * 5
    raw = [600 * MiB + k * 16 * MiB for k in range(5)]
    [f] = judge(flat, raw, CASE, "NVML")
    assert (
        f.kind == "leak"
        and "outside PyTorch's allocator" in f.message
        and "16.0 MiB per run" in f.message
    )
    [t] = judge([k * 4 * MiB for k in range(5)], [600 * MiB] * 5, CASE, "NVML")
    assert "PyTorch memory grows" in t.message
    # lazy initialization in the second run only: a step, not a leak
    assert (
        judge(
            [0, 2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB],
            [600 * MiB, 640 * MiB] + [640 * MiB] * 3,
            CASE,
            "NVML",
        )
        == []
    )


def test_leak_detector_measures_nothing_without_cuda():
    d = Leak()
    d.case_started(CASE)
    d.repeat(lambda: None, 3)
    assert d.case_finished(CASE) == []
    assert {"leak", "double-activation"} <= {x.name for x in worker_detectors()}


def test_repeat_marker_in_a_real_worker(tmp_path):
    """The worker runs a marked body n times (fixtures once); a bad marker is a finding."""
    suite = tmp_path / "suites" / "rep"
    suite.mkdir(parents=True)
    (suite / "test_r.py").write_text(
        textwrap.dedent("""
        import pytest
        CALLS = []

        @pytest.fixture(scope="module")
        def made():
            CALLS.append("fixture")
            return CALLS

        @pytest.mark.gpucheck_repeat(4)
        def test_counted(made):
            made.append("body")

        def test_after(made):
            assert made.count("body") == 4 and made.count("fixture") == 1

        @pytest.mark.gpucheck_repeat(3)
        def test_fails_second_time(made):
            assert made.count("again") == 0 or False
            made.append("again")

        @pytest.mark.gpucheck_repeat("many")
        def test_bad_marker():
            pass
    """)
    )
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpucheck.cli",
            "run",
            "--cpu-only",
            "--quiet",
            "--suite",
            str(suite),
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    recs = {r["case"].split("::")[1]: r for r in results.cases(out / "results.jsonl")}
    assert recs["test_after"]["status"] == "passed", proc.stdout + proc.stderr
    again = recs["test_fails_second_time"]["findings"]
    assert [(f["kind"], f["severity"]) for f in again] == [("test-failure", "error")]
    assert "failed when repeated: run 2 of 3" in again[0]["message"]
    bad = recs["test_bad_marker"]["findings"]
    assert [f["kind"] for f in bad] == ["detector-error"] and "n >= 2" in bad[0]["message"]


def test_double_activation_detector_reads_round_trips():
    from gpucheck.checkpoints import roundtrip

    d = DoubleActivation()
    d.case_started(CASE)
    roundtrip.OUTCOMES.append(
        roundtrip.RoundtripReport(
            ok=False,
            fields={"log_scales": "came back as exp(saved)"},
            activated=["log_scales"],
            message="activation applied twice: log_scales came back activated; more",
        )
    )
    [f] = d.case_finished(CASE)
    assert (f.kind, f.severity) == ("double-activation", "error") and roundtrip.OUTCOMES == []
    assert f.message == "activation applied twice: log_scales came back activated"


# --- the run-level wiring --------------------------------------------------------------------


def test_diagnose_adds_memory_findings(tmp_path):
    path = tmp_path / "results.jsonl"
    results.append(
        path,
        {
            "schema": results.SCHEMA_ID,
            "record": "run",
            "run_id": "r1",
            "devices": [
                {"device": "cuda:0", "uuid": "GPU-a", "name": "H200", "memory_total": 150 * GiB}
            ],
        },
    )
    for r in [failed(STORY3_TORCH20), *(sized(n, 4 * n * n) for n in (1024, 2048, 4096))]:
        results.append(path, {**r.to_json(), "run_id": "r1"})
    made = pipeline._diagnose(tmp_path, path, "r1")
    kinds = sorted(d.findings[0].kind for d in made)
    assert kinds == ["memory-growth", "oom-anomaly"]
    assert all(d.mode == "blocking+nvml" for d in made)
    assert json.loads(path.read_text().splitlines()[-1])["record"] == "diagnosis"


def test_selftest_double_activation_row_on_cpu(tmp_path):
    """The self-test's checkpoint rows run without a GPU: the activated writer is found, its
    clean twin draws no finding."""
    from gpucheck.selftest import matrix, read_run

    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpucheck.cli",
            "run",
            "--cpu-only",
            "--quiet",
            "--suite",
            "selftest",
            "--out",
            str(out),
            "--",
            "-k",
            "roundtrip or double_activation",
        ],
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=300,
    )
    rows, false = matrix(*read_run(out))
    row = next(r for r in rows if r.defect.kind == "double-activation")
    assert row.status == "found", proc.stdout + proc.stderr
    assert false == [] and {r.status for r in rows if r is not row} == {"not run"}
