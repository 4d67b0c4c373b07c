"""``gpucheck run --distributed`` on CPU with gloo: real rank processes, real collectives.

The deliberate defects of suites/dist_selftest must each become ONE finding naming the
culprit (the last rank) within the timeout, and the run must go on to the clean case; the
collective log itself is checked in a one-rank group.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import clirun
from clirun import gpucheck

from gpucheck.model import results

ROOT = Path(__file__).resolve().parents[2]
DEFECTS = ROOT / "suites" / "dist_selftest"
#: hard limit of one gpucheck run in these tests: nothing may hang CI
RUN_LIMIT_S = 150


def gpucheck_run(out: Path, *args: str) -> tuple[int, list[dict[str, Any]], float]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    t0 = time.monotonic()
    proc = gpucheck(
        "run",
        "--distributed",
        "--cpu-only",
        "--out",
        str(out),
        "--quiet",
        *args,
        env=env,
        timeout=RUN_LIMIT_S,
        cwd=out.parent,
    )
    took = time.monotonic() - t0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, records, took


def group_findings(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """case name -> the harness's group record (the one with a ``distributed`` block)."""
    return {
        r["case"].split("::")[-1]: r
        for r in records
        if r.get("record") == "case" and "distributed" in r
    }


def test_every_defect_is_one_finding_naming_the_culprit(tmp_path: Path) -> None:
    # the stuck rank (found only by the timeout) runs in test_three_ranks_name_rank_two, with a
    # short timeout; here a generous one keeps the slow DDP case clear of it on a loaded CI
    code, records, took = gpucheck_run(
        tmp_path / "run",
        "--suite",
        str(DEFECTS),
        "--timeout",
        "40",
        "--world-size",
        "2",
        "--",
        "-k",
        "not stuck_rank",
    )
    assert code == 1
    found = group_findings(records)
    expected = {
        "test_skip_collective": "hang",
        "test_skip_async_collective": "hang",
        "test_wrong_device": "collective-device",
        "test_shape_mismatch": "collective-mismatch",
        "test_crash_one_rank": "rank-crash",
        "test_distributed_render_independent_scenes": "hang",
    }
    assert {c: r["distributed"]["kind"] for c, r in found.items()} == expected
    for case, record in found.items():
        d = record["distributed"]
        assert d["cause_ranks"] == [1], (case, d)
        assert record["device"] == "rank1/cpu"
        assert len(record["findings"]) == 1
        # at once: none of these waits for the timeout
        assert d["time_to_finding_s"] < 4.0, (case, d)
    skip = found["test_skip_collective"]["findings"][0]
    assert "rank 1 did not arrive at all_reduce #2" in skip["message"]
    assert "test_dist_defects.py:" in skip["message"]
    # every rank's stack, pytest frames cut: rank 1 waits at the case boundary
    assert "rank 0 Python stack" in skip["evidence"] and "in boundary" in skip["evidence"]
    crash = found["test_crash_one_rank"]["findings"][0]
    assert "SIGABRT" in crash["message"] and "cause" in crash["message"]
    assert "Fatal Python error: Aborted" in crash["evidence"]
    render = found["test_distributed_render_independent_scenes"]["findings"][0]
    assert "render_sharded(distributed=True)" in render["message"]
    assert "wrong mode for this use" in render["message"]
    # defects every rank sees alike are the ranks' own failures, on every rank
    for case, words in (
        ("test_distributed_render_replicated_scene", "DistributedModeError"),
        ("test_ddp_step_without_sync", "gradients differ from one process"),
    ):
        failed = [r for r in records if r.get("record") == "case" and r["case"].endswith(case)]
        assert sorted(r["device"] for r in failed) == ["rank0/cpu", "rank1/cpu"], case
        assert all(
            r["status"] == "failed" and words in r["findings"][0]["message"] for r in failed
        ), case
    # the run went on: the clean case passed on both ranks in a fresh group
    clean = [
        r
        for r in records
        if r.get("record") == "case" and r["case"].endswith("test_clean_after_defects")
    ]
    assert sorted(r["device"] for r in clean) == ["rank0/cpu", "rank1/cpu"]
    assert all(r["status"] == "passed" for r in clean)
    assert took < RUN_LIMIT_S


def test_dist_suite_passes_on_gloo(tmp_path: Path) -> None:
    """The DDP step and distributed rendering checks, CPU references, 3 ranks (uneven
    shards); autocast cases are skipped with their reason (they need CUDA)."""
    code, records, _ = gpucheck_run(tmp_path / "run", "--world-size", "3", "--timeout", "60")
    cases = [r for r in records if r.get("record") == "case"]
    assert code == 0, [
        (r["device"], r["case"], r["reason"]) for r in cases if r["status"] != "passed"
    ]
    ran = {(r["device"], r["case"].split("::")[-1]) for r in cases if r["status"] == "passed"}
    for rank in range(3):
        for case in (
            "test_ddp_step_matches_one_process[None]",
            "test_sharded_render_equals_single_render",
            "test_independent_mode_issues_no_collective",
        ):
            assert (f"rank{rank}/cpu", case) in ran
    skipped = [r for r in cases if r["status"] == "skipped"]
    assert len(skipped) == 6 and all("CUDA" in r["reason"] for r in skipped)


def test_three_ranks_name_rank_two(tmp_path: Path) -> None:
    _, records, _ = gpucheck_run(
        tmp_path / "run",
        "--suite",
        str(DEFECTS),
        "--timeout",
        "6",
        "--world-size",
        "3",
        "--",
        "-k",
        "skip_collective or shape_mismatch or stuck_rank",
    )
    found = group_findings(records)
    assert {
        c: (
            r["distributed"]["kind"],
            r["distributed"]["cause_ranks"],
            r["distributed"]["waiting_ranks"],
        )
        for c, r in found.items()
    } == {
        "test_skip_collective": ("hang", [2], [0, 1]),
        "test_shape_mismatch": ("collective-mismatch", [2], [0, 1]),
        "test_stuck_rank": ("hang", [2], [0, 1]),
    }
    stuck = found["test_stuck_rank"]
    assert 6.0 <= stuck["distributed"]["time_to_finding_s"] < 8.0  # the timeout, plus a poll
    finding = stuck["findings"][0]
    assert "within the timeout" in finding["message"]
    assert "in test_stuck_rank" in finding["evidence"]  # rank 2's own frame, from its stack
    if shutil.which("py-spy") is None:
        assert "py-spy is not installed" in finding["evidence"]
    else:  # rank 2's native frames, taken before the freeze (py-spy cannot read a stopped one)
        native = finding["evidence"].split("--- rank 2 py-spy dump --native ---\n")[1]
        assert (
            native.startswith("Thread ")
            and "test_stuck_rank (test_dist_defects.py:" in native.split("\n---")[0]
        ), native[:600]


def test_stuck_rank_is_found_within_its_own_limit_not_the_default_timeout(tmp_path: Path) -> None:
    """The culprit sleeps in its own code: alive, inside the case, outside any collective, it
    looks like a slow rank, so only a time limit can name it. With the default --timeout
    (900 s) the run waited that long; the case declares dist_timeout(10). Piped, the live line
    is plain text (it printed raw '[red]hang[/]')."""
    out = tmp_path / "run"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    t0 = time.monotonic()
    proc = gpucheck(
        "run",
        "--distributed",
        "--cpu-only",
        "--out",
        str(out),
        "--suite",
        str(DEFECTS),
        "--",
        "-k",
        "stuck_rank",
        env=env,
        timeout=RUN_LIMIT_S,
        cwd=tmp_path,
    )
    took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert records[0]["config"]["timeout"] == 900.0
    stuck = group_findings(records)["test_stuck_rank"]["distributed"]
    assert (stuck["kind"], stuck["cause_ranks"]) == ("hang", [1])
    assert 10.0 <= stuck["time_to_finding_s"] < 15.0
    assert took < 60
    assert "[red]" not in proc.stdout and "\x1b[" not in proc.stdout
    live = [line for line in proc.stdout.splitlines() if line.startswith("hang after ")]
    assert (
        len(live) == 1
        and "in test_dist_defects.py::test_stuck_rank: rank 1 did not arrive at all_reduce #1"
        in live[0]
    )


LOG_SCRIPT = textwrap.dedent("""
    import json, os, sys, torch, torch.distributed as dist
    from pathlib import Path
    from gpucheck.distributed import collectives
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0",
                      WORLD_SIZE="1")
    log = collectives.install(Path(sys.argv[1]), 0, "cpu")
    dist.init_process_group("gloo")
    log.case_started("c")
    dist.all_reduce(torch.ones(3, dtype=torch.float64))
    out = [None]
    dist.all_gather_object(out, {"a": 1})  # its inner collectives are not logged again
    try:
        dist.all_reduce(torch.ones(2, device="meta"))
    except collectives.CollectiveDeviceError as err:
        print("refused:", err)
    log.case_finished("c", "passed")
    dist.destroy_process_group()
""")


def test_collective_log_entries(tmp_path: Path) -> None:
    from gpucheck.controller.dist_group import free_port
    from gpucheck.distributed import collectives

    script = tmp_path / "log.py"
    script.write_text(LOG_SCRIPT)
    path = tmp_path / "rank0.jsonl"
    proc = subprocess.run(
        [sys.executable, str(script), str(path), str(free_port())],
        capture_output=True,
        text=True,
        timeout=50,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused: rank 0: all_reduce #3 got a tensor on meta" in proc.stdout
    entries = collectives.read(path)
    assert [(e.ev, e.seq, e.op) for e in entries] == [
        ("case", 0, None),
        ("enter", 1, "all_reduce"),
        ("done", 1, "all_reduce"),
        ("enter", 2, "all_gather_object"),
        ("done", 2, "all_gather_object"),
        ("enter", 3, "all_reduce"),
        ("error", 3, "all_reduce"),
        ("case-end", 3, None),
    ]
    first = entries[1]
    assert first.shapes == [[3]] and first.dtypes == ["float64"]
    assert first.devices == ["cpu"] and first.case == "c"
    assert first.where is not None and first.where.startswith("log.py:")
    assert entries[6].kind == "device" and entries[6].case == "c"


def test_under_torchrun_each_process_owns_its_rank(tmp_path: Path) -> None:
    """torchrun starts the gpucheck processes; each runs the rank torchrun gave it, the
    ranks meet through the shared --out folder, and global rank 0 writes the report."""
    out = tmp_path / "run"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **_torchrun_tmp(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(_port()),
            "-m",
            "gpucheck.cli",
            "run",
            "--distributed",
            "--cpu-only",
            "--out",
            str(out),
            "--suite",
            str(DEFECTS),
            "--timeout",
            "6",
            "--quiet",
            "--",
            "-k",
            "skip_collective or clean",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=RUN_LIMIT_S,
        cwd=tmp_path,
    )
    assert proc.returncode != 0  # torchrun passes on rank 0's exit code 1: findings
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    found = group_findings(records)
    assert list(found) == ["test_skip_collective"]  # one finding, not one per owner
    assert found["test_skip_collective"]["distributed"]["cause_ranks"] == [1]
    clean = [
        r["device"]
        for r in records
        if r.get("record") == "case"
        and r["case"].endswith("test_clean_after_defects")
        and r["status"] == "passed"
    ]
    assert sorted(clean) == ["rank0/cpu", "rank1/cpu"]
    assert (out / "report.html").exists() and records[-1]["record"] == "end"


def _torchrun_tmp(folder: Path) -> dict[str, str]:
    """torchrun's log folders (torchelastic_*) in the test's folder, not left in /tmp."""
    return {"TMPDIR": str(folder)}


def _port() -> int:
    from gpucheck.controller.dist_group import free_port

    return free_port()


def test_no_free_port_for_the_rendezvous_is_one_sentence(monkeypatch):
    """A host with no port to bind gets one sentence naming it, not an OSError's traceback."""
    import pytest

    from gpucheck.controller import dist_group
    from gpucheck.errors import EnvironmentProblem

    class NoPorts:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            raise OSError(98, "Address already in use")

    monkeypatch.setattr(dist_group.socket, "socket", lambda *a, **k: NoPorts())
    with pytest.raises(EnvironmentProblem, match=r"no free TCP port on .* rendezvous"):
        dist_group.free_port()
    monkeypatch.undo()
    assert 0 < dist_group.free_port() < 65536


#: ranks run at their own pace between collectives: the last rank takes 10x longer a case
SKEW = {
    "test_skew.py": textwrap.dedent("""
        import os, time, pytest

        @pytest.mark.parametrize("i", range(6))
        def test_skew(i):
            last = int(os.environ["RANK"]) == int(os.environ["WORLD_SIZE"]) - 1
            time.sleep(1.0 if last else 0.1)
    """)
}


def _skew_suite(root: Path) -> Path:
    folder = root / "suites" / "skew"
    folder.mkdir(parents=True)
    for name, text in SKEW.items():
        (folder / name).write_text(text)
    return folder


def _by_rank(out: Path) -> dict[str, list[str]]:
    """device -> the cases it recorded (each once: a second record of a case is an error)."""
    found: dict[str, list[str]] = {}
    for r in results.cases(out / "results.jsonl"):
        found.setdefault(r["device"], []).append(r["case"])
    for device, cases in found.items():
        assert len(cases) == len(set(cases)), (device, cases)
    return found


def _stop_when_skewed(proc: subprocess.Popen[str], out: Path) -> None:
    """SIGTERM once rank 0 recorded its six cases and the last rank one or two."""
    deadline = time.monotonic() + RUN_LIMIT_S
    while True:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the ranks did not get apart"
        with contextlib.suppress(OSError, ValueError):
            done = _by_rank(out)
            if len(done.get("rank0/cpu", [])) == 6 and 1 <= len(done.get("rank1/cpu", [])) < 6:
                break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)


def test_a_skewed_rank_stopped_by_sigterm_resumes_its_own_cases(tmp_path: Path) -> None:
    """Rank 1 falls behind rank 0 (no collective holds them together); SIGTERM stops the run
    with rank 0 done and rank 1 not: the run ends interrupted (143), and --resume runs rank
    1's cases (rank 0 runs them again with it, unrecorded): six records per rank, each once,
    passed. It passed with rank 1's cases missing when any rank's record counted for all."""
    suite, out = _skew_suite(tmp_path), tmp_path / "run"
    proc = clirun.start(
        "run", "--distributed", "--cpu-only", "--quiet", "--suite", str(suite),
        "--out", str(out), cwd=tmp_path, env={"CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    _stop_when_skewed(proc, out)
    said, _ = proc.communicate(timeout=RUN_LIMIT_S)
    assert proc.returncode == 143, said
    before = _by_rank(out)
    resumed = gpucheck("run", "--resume", str(out), cwd=tmp_path, timeout=RUN_LIMIT_S)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = _by_rank(out)
    assert {d: len(c) for d, c in after.items()} == {"rank0/cpu": 6, "rank1/cpu": 6}
    assert after["rank0/cpu"] == before["rank0/cpu"]  # rank 0's were not run into records
    last = resumed.stdout.strip().splitlines()[-1]
    assert last.startswith("passed (exit 0): 12 case(s)"), last


def test_under_torchrun_a_skewed_rank_stopped_by_sigterm_resumes_its_own_cases(tmp_path):
    """The same under torchrun: each rank's owner is its own gpucheck process; the resumed
    group starts after the first invocation's files (torchrun's store hands rank 0's owner's
    first generation to the other), and each owner runs its rank's cases."""
    suite, out = _skew_suite(tmp_path), tmp_path / "run"

    def torchrun(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
             "--nproc-per-node", "2", "--master-port", str(_port()), "-m", "gpucheck.cli",
             "run", "--quiet", *args],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **_torchrun_tmp(tmp_path)},
        )  # fmt: skip

    proc = torchrun("--distributed", "--cpu-only", "--suite", str(suite), "--out", str(out))
    _stop_when_skewed(proc, out)
    said, _ = proc.communicate(timeout=RUN_LIMIT_S)
    assert proc.returncode != 0, said
    end = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()][-1]
    assert end["record"] == "end" and end["interrupted"], end  # resumable
    before = _by_rank(out)
    proc = torchrun("--resume", str(out))
    said, _ = proc.communicate(timeout=RUN_LIMIT_S)
    assert proc.returncode == 0, said
    after = _by_rank(out)
    assert {d: len(c) for d, c in after.items()} == {"rank0/cpu": 6, "rank1/cpu": 6}
    assert after["rank0/cpu"] == before["rank0/cpu"]
    report = json.loads((out / "results.json").read_text())
    assert report["summary"]["verdict"] == "passed" and report["state"]["complete"]
