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


def _run_mine(tmp_path, *extra):
    from gpucheck import cli

    suite = tmp_path / "mine"
    suite.mkdir()
    (suite / "test_x.py").write_text("def test_x():\n    pass\n")
    cli.main(["run", "--suite", str(suite), "--out", str(tmp_path / "out"), *extra])


def test_workers_on_two_gpus_share_the_cpus(tmp_path, monkeypatch, two_gpus, harness_specs):
    """Two workers at once, each torch's default of one CPU thread per CPU, spin against each
    other: each gets half of the CPUs this process may use."""
    import os

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)), raising=False)
    _run_mine(tmp_path)
    shares = {(s.label, s.mode): s.env.get("OMP_NUM_THREADS") for p in harness_specs for s in p}
    assert shares and set(shares.values()) == {"16"}, shares
    assert {label for label, _ in shares} == {"cuda:0", "cuda:1"}
    import json

    header = json.loads((tmp_path / "out" / "results.jsonl").read_text().splitlines()[0])
    assert any("OMP_NUM_THREADS=16" in n for n in header["notes"]), header["notes"]


def test_the_users_thread_count_is_passed_on(tmp_path, monkeypatch, two_gpus, harness_specs):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    _run_mine(tmp_path)
    specs = [s for p in harness_specs for s in p]
    assert specs and all("OMP_NUM_THREADS" not in s.env for s in specs)


def test_one_worker_keeps_every_cpu(monkeypatch):
    import os

    from gpucheck.controller.spawning import thread_share

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(3)), raising=False)
    assert thread_share(1) == {}
    assert thread_share(2) == {"OMP_NUM_THREADS": "1"}
    assert thread_share(8) == {"OMP_NUM_THREADS": "1"}  # never none


def test_a_resumed_run_runs_a_pass_stopped_mid_way_and_skips_a_finished_one(tmp_path):
    """The default --cpu-only run's distributed pass: a resume skips it once every case its
    ranks planned has a record, not as soon as one has (a run stopped inside it said passed
    with its cases missing)."""
    from gpucheck.controller.pipeline import mode_done
    from gpucheck.model import results
    from gpucheck.model.results import CaseRecord
    from gpucheck.model.runlog import CasePlan, RunLog

    path = tmp_path / "results.jsonl"
    results.append(path, {"schema": results.SCHEMA_ID, "record": "run", "run_id": "r"})
    assert not mode_done(RunLog(path), "r", "dist")  # not started
    for rank in (0, 1):
        results.append(path, CasePlan("r", f"rank{rank}/cpu", "dist", {"d": ["a", "b"]}).to_json())
    for device, case in (("rank0/cpu", "a"), ("rank0/cpu", "b"), ("rank1/cpu", "a")):
        results.append(path, CaseRecord("r", device, "d", case, "dist", "passed").to_json())
    assert not mode_done(RunLog(path), "r", "dist")  # rank 1 has no record of b
    results.append(path, CaseRecord("r", "rank1/cpu", "d", "b", "dist", "passed").to_json())
    assert mode_done(RunLog(path), "r", "dist")
