"""The pytest plugin as users' suites see it (run through pytester, in-process)."""

from __future__ import annotations


def test_markers_are_registered_for_strict_markers(pytester):
    pytester.makepyfile('''
        import pytest
        @pytest.mark.gpu
        @pytest.mark.multigpu
        @pytest.mark.sanitizer
        @pytest.mark.slow
        def test_marked():
            assert True
    ''')
    result = pytester.runpytest("--strict-markers")
    result.assert_outcomes(passed=1)


def test_gpu_device_skips_with_a_reason_without_cuda(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile('''
        def test_needs_gpu(gpu_device):
            assert gpu_device.type == "cuda"
    ''')
    result = pytester.runpytest_subprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no CUDA device visible*"])


def test_target_device_out_of_range_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile('''
        def test_needs_gpu(gpu_device):
            pass
    ''')
    result = pytester.runpytest_subprocess(
                                           "--gpucheck-device", "3")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*target device(s) ?3? not visible*"])
