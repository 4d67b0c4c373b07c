"""``gpucheck run --ray``: on a local multi-node Ray cluster (``ray.cluster_utils.Cluster``,
nodes that declare GPUs, CPU-only cases) a suite runs on every node into one run folder and
one report; a node killed mid-run leaves a ``lost`` record naming it and its unfinished cases,
and ``--resume`` runs only those, each case once.

Ray is an optional extra (``torch-gpucheck[ray]``); nox's tests session (what CI runs) installs it
and sets ``$GPUCHECK_RAY_TESTS``, so there (or with ``$CI`` set) a missing Ray fails these
tests instead of skipping them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
from fleet import cases, make_suite

try:
    from ray.cluster_utils import Cluster
except ImportError:  # pragma: no cover - Ray is the extra [ray]
    if os.environ.get("CI") or os.environ.get("GPUCHECK_RAY_TESTS"):
        raise
    pytest.skip('Ray is not installed (python -m pip install "ray>=2.40")', allow_module_level=True)

from gpucheck.controller.config import RunConfig
from gpucheck.controller.fleet import NODE_LABEL, Collector, Node, plan_group
from gpucheck.controller.fleet_node import NodeTargets
from gpucheck.errors import EnvironmentProblem, UsageProblem
from gpucheck.model import results
from gpucheck.model.fleet import NodeLost

#: test_block waits for the file RELEASE (the nodes' processes do not get the test's env)
BLOCKING = {
    "test_block.py": textwrap.dedent("""
        import time
        from pathlib import Path

        def test_first():
            pass

        def test_second():
            pass

        def test_block():
            release = Path(__file__).parent / "release"
            deadline = time.time() + 120
            while not release.exists() and time.time() < deadline:
                time.sleep(0.1)

        def test_after():
            pass
    """)
}


def _node(cluster: Cluster, name: str, gpus: int):
    return cluster.add_node(num_cpus=1, num_gpus=gpus, labels={NODE_LABEL: name})


@pytest.fixture
def cluster():
    """A head without GPUs and two nodes that declare some (node-a: 2, node-b: 1)."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = {"node-a": _node(c, "node-a", 2), "node-b": _node(c, "node-b", 1)}
    c.wait_for_nodes()
    yield c, nodes
    c.shutdown()


def _run(cwd: Path, address: str, *args: str):
    return subprocess.Popen(
        [sys.executable, "-m", "gpucheck.cli", "run", "--quiet", "--ray", address, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )


def _lost(out: Path) -> list[NodeLost]:
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    found = [NodeLost.from_json(r) for r in lines if r.get("record") == "lost"]
    return [x for x in found if x is not None]


def test_a_suite_runs_on_every_node_into_one_report(cluster, tmp_path: Path) -> None:
    c, _ = cluster
    make_suite(tmp_path)
    proc = _run(tmp_path, c.address, "--cpu-only", "--suite", "demo", "--out", "run")
    said, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, said  # test_fails fails on each node, as on one machine
    assert "Traceback" not in said
    out = tmp_path / "run"
    recs = cases(out)
    per_device = Counter(r["device"] for r in recs)
    assert per_device == {"node-a/cpu": 8, "node-b/cpu": 8}
    # each case once per device, the same cases on every node
    assert len({(r["device"], r["case"], r["mode"]) for r in recs}) == len(recs)
    by_node = {d: {r["case"] for r in recs if r["device"] == d} for d in per_device}
    assert by_node["node-a/cpu"] == by_node["node-b/cpu"]
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["devices"] == ["node-a/cpu", "node-b/cpu"]
    assert summary["by_status"] == {"passed": 12, "failed": 2, "skipped": 2}
    assert (out / "report.html").is_file() and (out / "junit.xml").is_file()
    header = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert header["config"]["ray"] == c.address
    assert {d["device"] for d in header["devices"]} == {"node-a/cpu", "node-b/cpu"}
    assert not _lost(out)


def test_a_lost_node_is_named_and_resume_runs_only_what_it_missed(cluster, tmp_path) -> None:
    c, nodes = cluster
    release = make_suite(tmp_path, BLOCKING) / "release"
    out = tmp_path / "run"
    proc = _run(tmp_path, c.address, "--cpu-only", "--suite", "demo", "--out", "run")
    deadline = time.time() + 180
    while time.time() < deadline:  # node-b is inside test_block once its first two are in
        if sum(r["device"] == "node-b/cpu" for r in cases(out)) >= 2:
            break
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.2)
    else:
        pytest.fail("node-b did not reach test_block")
    c.remove_node(nodes["node-b"])
    release.write_text("go")
    said, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, said  # interrupted (the exit code of an interrupted run)
    assert "Traceback" not in said
    schema = jsonschema.Draft202012Validator(results.schema())
    for line in (out / "results.jsonl").read_text().splitlines():
        schema.validate(json.loads(line))  # the lost record too
    lost = _lost(out)
    assert [x.node for x in lost] == ["node-b"]
    missed = sorted(case for _, _, case in lost[0].cases)
    assert missed == ["test_block.py::test_after", "test_block.py::test_block"]
    assert {d for d, _, _ in lost[0].cases} == {"node-b/cpu"}
    end = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()][-1]
    assert end["record"] == "end" and end["interrupted"]
    assert "node-b" in end["reason"]
    before = Counter(r["device"] for r in cases(out))
    assert before == {"node-a/cpu": 4, "node-b/cpu": 2}

    _node(c, "node-b", 1)  # the node is back (rebooted): the run can finish
    c.wait_for_nodes()
    proc = _run(tmp_path, c.address, "--resume", "run")
    said, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, said
    recs = cases(out)
    keys = Counter((r["device"], r["case"], r["mode"]) for r in recs)
    assert set(keys.values()) == {1}, keys  # every case once
    assert Counter(r["device"] for r in recs) == {"node-a/cpu": 4, "node-b/cpu": 4}
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["verdict"] == "passed"


def test_without_ray_the_run_says_how_to_get_it(tmp_path: Path) -> None:
    make_suite(tmp_path)
    code = "import sys; sys.modules['ray'] = None; from gpucheck.cli import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", code, "run", "--cpu-only", "--ray", "--suite", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert 'python -m pip install "ray>=2.40"' in proc.stderr
    assert not (tmp_path / "reports").exists()


def test_the_collector_appends_whole_batches_and_keeps_plans(tmp_path: Path) -> None:
    collector = Collector(str(tmp_path))
    collector.append("results", b'{"a":1}\n')
    collector.append("results", b'{"b":2}\n{"c":3}\n')
    collector.plan("node-a/cpu", "blocking", ["t.py::x", "t.py::y"])
    collector.plan("node-a/cpu", "blocking", ["t.py::y"])
    assert (tmp_path / "results.jsonl").read_text() == '{"a":1}\n{"b":2}\n{"c":3}\n'
    assert collector.planned() == [("node-a/cpu", "blocking", ["t.py::x", "t.py::y"])]


# ---- the distributed suite across nodes (--ray --distributed) -----------------------------

ROOT = Path(__file__).resolve().parents[2]
RANKS = ("node-a/rank0/cpu", "node-a/rank1/cpu", "node-b/rank2/cpu")


def _start_dist(cwd: Path, address: str, suite: str, *args: str) -> subprocess.Popen[str]:
    return _run(
        cwd, address, "--distributed", "--cpu-only", "--suite", suite, "--out", "run",
        "--timeout", "60", *args,
    )  # fmt: skip


def _dist(cwd: Path, address: str, suite: str, *args: str) -> tuple[int, str, list[dict]]:
    proc = _start_dist(cwd, address, str(ROOT / "suites" / suite), *args)
    said, _ = proc.communicate(timeout=300)
    return proc.returncode, said, cases(cwd / "run")


def test_the_distributed_suite_runs_as_one_group_over_the_nodes(cluster, tmp_path) -> None:
    """node-a declares 2 GPUs, node-b 1: three gloo ranks, 0 and 1 on node-a, 2 on node-b,
    one group (its collectives span the nodes), one run folder on the head."""
    c, _ = cluster
    code, said, recs = _dist(tmp_path, c.address, "dist")
    assert code == 0, said
    assert "Traceback" not in said
    assert Counter(r["device"] for r in recs) == dict.fromkeys(RANKS, 5)
    passed = {(r["device"], r["case"].split("::")[-1]) for r in recs if r["status"] == "passed"}
    for rank in RANKS:
        for case in (
            "test_ddp_step_matches_one_process[None]",
            "test_sharded_render_equals_single_render",
            "test_independent_mode_issues_no_collective",
        ):
            assert (rank, case) in passed
    assert all(r["mode"] == "dist" and not r["findings"] for r in recs)
    out = tmp_path / "run"
    header = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert [d["device"] for d in header["devices"]] == list(RANKS)
    assert any("3 rank(s) on 2 node(s), backend gloo" in n for n in header["notes"])
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["devices"] == list(RANKS) and summary["verdict"] == "passed"
    assert (out / "report.html").is_file()


def test_a_rank_that_dies_or_hangs_on_one_node_is_named_with_its_node(cluster, tmp_path) -> None:
    """Rank 2 (node-b) aborts in one case and sleeps outside any collective in another
    (dist_timeout 10 s): each is ONE finding naming node-b and rank 2, found by the harness
    of whichever node saw it first; the ranks of both nodes are stopped, a fresh group
    runs the clean case after them on every rank, and the run ends."""
    c, _ = cluster
    t0 = time.monotonic()
    code, said, recs = _dist(
        tmp_path, c.address, "dist_selftest", "--", "-k", "crash_one_rank or stuck_rank or clean"
    )
    took = time.monotonic() - t0
    assert code == 1, said
    assert "Traceback" not in said
    found = {r["case"].split("::")[-1]: r for r in recs if "distributed" in r}
    assert sorted(found) == ["test_crash_one_rank", "test_stuck_rank"]
    for case, kind in (("test_crash_one_rank", "rank-crash"), ("test_stuck_rank", "hang")):
        record = found[case]
        assert (record["distributed"]["kind"], record["distributed"]["cause_ranks"]) == (kind, [2])
        assert record["device"] == "node-b/rank2/cpu"
        finding = record["findings"][0]
        assert finding["device"] == "node-b/rank2/cpu"
        assert "rank 2 is node-b/rank2/cpu on node node-b" in finding["message"]
    assert (
        "--- rank 2 stderr (why it ended) ---"
        in found["test_crash_one_rank"]["findings"][0]["evidence"]
    )
    stuck = found["test_stuck_rank"]
    assert 10.0 <= stuck["distributed"]["time_to_finding_s"] < 20.0
    assert "in test_stuck_rank" in stuck["findings"][0]["evidence"]  # node-b's stack, sent over
    clean = {r["device"] for r in recs if r["case"].endswith("test_clean_after_defects")}
    assert clean == set(RANKS)
    assert all(r["status"] == "passed" for r in recs if r["case"].endswith("clean_after_defects"))
    assert took < 120


#: every rank says it is in test_wait (nodes of a local cluster share the file system), then
#: waits there for a file that never comes
WAITING = {
    "test_dist_wait.py": textwrap.dedent("""
        import time
        from pathlib import Path

        def test_first(dist_rank):
            pass

        def test_wait(dist_rank):
            (Path(__file__).parent / f"in-{dist_rank.rank}").write_text("here")
            deadline = time.time() + 120
            while not (Path(__file__).parent / "release").exists() and time.time() < deadline:
                time.sleep(0.1)

        def test_after(dist_rank):
            pass
    """)
}


def test_a_node_lost_mid_group_stops_the_other_nodes_ranks(cluster, tmp_path) -> None:
    """node-b (rank 2) is lost while every rank is inside test_wait (test_first's records
    at the head): the head stops node-a's
    ranks at once (they would wait for rank 2 until the timeout), records node-b lost with
    the cases it did not finish, and the run ends interrupted."""
    c, nodes = cluster
    folder = make_suite(tmp_path, WAITING)
    out = tmp_path / "run"
    proc = _start_dist(tmp_path, c.address, "demo")
    deadline = time.time() + 180
    while not all((folder / f"in-{r}").exists() for r in range(3)) or len(cases(out)) < 3:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.time() < deadline, "the ranks did not reach test_wait"
        time.sleep(0.2)
    c.remove_node(nodes["node-b"])
    t0 = time.monotonic()
    said, _ = proc.communicate(timeout=300)
    assert time.monotonic() - t0 < 30  # not the 60 s timeout, nor test_wait's 120 s
    assert proc.returncode == 130, said
    assert "Traceback" not in said
    assert Counter(r["device"] for r in cases(out)) == dict.fromkeys(RANKS, 1)  # test_first
    lost = _lost(out)
    assert [x.node for x in lost] == ["node-b"]
    assert sorted(case for _, _, case in lost[0].cases) == [
        "test_dist_wait.py::test_after",
        "test_dist_wait.py::test_wait",
    ]
    end = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()][-1]
    assert end["record"] == "end" and end["interrupted"] and "node-b" in end["reason"]
    assert "node-a: the group's ranks here were stopped: node node-b did not finish" in said


def test_distributed_nodes_need_one_torch_and_the_world_size_the_gpus_make() -> None:
    fleet = [Node("a1", "node-a", 2, "10.0.0.1"), Node("b1", "node-b", 1, "10.0.0.2")]

    def found(torch_b: str) -> list[NodeTargets]:
        return [
            NodeTargets("node-a", [], 0, [], {}, "2.13.0"),
            NodeTargets("node-b", [], 0, [], {}, torch_b),
        ]

    cfg = RunConfig(cpu_only=True, distributed=True, ray="local")
    with pytest.raises(
        EnvironmentProblem,
        match=re.escape("same torch on every node, and node-a has 2.13.0, node-b has 2.12.1"),
    ):
        plan_group(cfg, fleet, found("2.12.1"), {})
    group = plan_group(cfg, fleet, found("2.13.0"), {})
    assert [r.label for r in group.ranks] == list(RANKS) and group.master_addr == "10.0.0.1"
    with pytest.raises(UsageProblem, match="--world-size 2 but 3 GPU"):
        plan_group(
            RunConfig(cpu_only=True, distributed=True, world_size=2), fleet, found("2.13.0"), {}
        )
