"""memory-growth: a case's peak memory fitted over its size parameter, on case records."""

from __future__ import annotations

from memkit import GiB, sized

from gpucheck.detectors.memory_growth import growth


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
        r.memory.torch_allocated_at_start = at_start
    [f] = growth(recs)
    assert "size^2.00" in f.message and "4,096: 64.0 MiB" in f.message
    for r in recs:
        r.memory.torch_allocated_at_start = None
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
