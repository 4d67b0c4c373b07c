"""oom and oom-anomaly: the OOM parser on messages recorded on an H200 (tests/fixtures/oom/)
and torch's older wordings, and the anomalies it finds at a case's failure."""

from __future__ import annotations

from dataclasses import replace

import pytest
from memkit import OOM, TORCH20_OOM, GiB, MiB, failed, recorded

from gpucheck.detectors.memory_growth import size_of
from gpucheck.detectors.oom_anomaly import oom_findings, parse_memory_anomaly, parse_oom

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
    m = parse_oom(TORCH20_OOM)
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


def test_a_request_beyond_the_device_is_an_anomaly():
    [f] = oom_findings([failed(TORCH20_OOM)])
    assert (f.kind, f.severity) == ("oom-anomaly", "error")
    assert "52.32 GiB on a device of 23.68 GiB" in f.message and "2.2x" in f.message
    assert "activated twice" in (f.hint or "") and "requested=" in (f.evidence or "")


def test_reruns_of_the_wrong_device_check_are_not_counted_twice():
    rerun = replace(failed(TORCH20_OOM), mode="blocking+nvml|rerun:target-current")
    assert len(oom_findings([failed(TORCH20_OOM), rerun])) == 1


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
