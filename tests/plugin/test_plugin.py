"""The pytest plugin as users' suites see it (run through pytester, in-process)."""

from __future__ import annotations


def test_markers_are_registered_for_strict_markers(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.gpu
        @pytest.mark.multigpu
        @pytest.mark.sanitizer
        @pytest.mark.slow
        def test_marked():
            assert True
    """)
    result = pytester.runpytest("--strict-markers")
    result.assert_outcomes(passed=1)


def test_gpu_device_skips_with_a_reason_without_cuda(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile("""
        def test_needs_gpu(gpu_device):
            assert gpu_device.type == "cuda"
    """)
    result = pytester.runpytest_subprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no CUDA device visible*"])


def test_target_device_out_of_range_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile("""
        def test_needs_gpu(gpu_device):
            pass
    """)
    result = pytester.runpytest_subprocess("--gpucheck-device", "3")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*target device(s) ?3? not visible*"])


def test_sanitizer_tools_marker_keeps_a_case_in_its_tools_passes_only(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.sanitizer
        def test_every_tool():
            pass
        @pytest.mark.sanitizer(tools=("racecheck",))
        def test_race():
            pass
        @pytest.mark.sanitizer(tools=["memcheck", "initcheck"])
        def test_memory():
            pass
        def test_too_big_for_the_sanitizer():
            pass
    """)
    by_tool = {}
    for tool in ("memcheck", "racecheck", "initcheck", "synccheck"):
        result = pytester.runpytest(
            "--strict-markers", "-m", "sanitizer", "-v", "--gpucheck-sanitizer-tool", tool
        )
        by_tool[tool] = sorted(
            line.split("::")[1].split()[0] for line in result.outlines if "PASSED" in line
        )
        assert "skipped" not in result.parseoutcomes()  # deselected, never skipped
    assert by_tool == {
        "memcheck": ["test_every_tool", "test_memory"],
        "racecheck": ["test_every_tool", "test_race"],
        "initcheck": ["test_every_tool", "test_memory"],
        "synccheck": ["test_every_tool"],
    }
    # outside a sanitizer pass the marker selects nothing away
    pytester.runpytest("--strict-markers").assert_outcomes(passed=4)


def test_sanitizer_tools_marker_with_an_unknown_tool_is_a_usage_error(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.sanitizer(tools=("racechek",))
        def test_typo():
            pass
    """)
    result = pytester.runpytest()
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*unknown tool(s)*racechek*known: memcheck*"])
