"""The passes a run plans: sanitizer passes in both arrangements on two GPUs, and the
target-current passes telling their workers."""

from __future__ import annotations


def test_sanitizer_passes_run_in_both_arrangements_on_two_gpus():
    from gpucheck.controller.config import plan_passes

    assert plan_passes(("blocking", "nvml", "sanitizer:memcheck"), devices=2) == [
        ("blocking+nvml", None),
        ("sanitizer:memcheck", "memcheck"),
        ("sanitizer:memcheck|target-current", "memcheck"),
    ]
    # one GPU: there is no other device to make current, so one arrangement is all there is
    assert plan_passes(("sanitizer:racecheck",), devices=1) == [
        ("sanitizer:racecheck", "racecheck")
    ]


def test_target_current_passes_tell_their_workers(tmp_path, monkeypatch, two_gpus, harness_specs):
    from gpucheck import cli
    from gpucheck.sanitizer import command as sanitizer_cmd

    monkeypatch.setattr(sanitizer_cmd, "find", lambda: tmp_path / "compute-sanitizer")
    suite = tmp_path / "mine"
    suite.mkdir()
    (suite / "test_x.py").write_text("def test_x():\n    pass\n")
    cli.main(
        [
            "run",
            "--suite",
            str(suite),
            "--mode",
            "sanitizer:memcheck",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    arrangement = {
        (s.label, s.mode): s.env["GPUCHECK_CURRENT"] for specs in harness_specs for s in specs
    }
    assert arrangement == {
        ("cuda:0", "sanitizer:memcheck"): "other",
        ("cuda:1", "sanitizer:memcheck"): "other",
        ("cuda:0", "sanitizer:memcheck|target-current"): "target",
        ("cuda:1", "sanitizer:memcheck|target-current"): "target",
    }
