"""``gpucheck run --ray``: on a local multi-node Ray cluster (``ray.cluster_utils.Cluster``,
nodes that declare GPUs, CPU-only cases; one for the module, its nodes put back after a test
that removes one) a suite runs on every node into one run folder and one report; a node killed
mid-run leaves a ``lost`` record naming it and the cases its loss left without a record, and
``--resume`` runs exactly those, each case once; the console's last line is the verdict, Ray's
own lines are in the run folder's ray.log; ``--cpu-only`` runs on a Ray instance without GPUs.

Ray is an optional extra (``torch-gpucheck[ray]``); nox's tests session (what CI runs) installs it
and sets ``$GPUCHECK_RAY_TESTS``, so there (or with ``$CI`` set) a missing Ray fails these
tests instead of skipping them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
from clirun import NO_GPU, gpucheck, start
from fleet import cases, make_suite

try:
    from ray.cluster_utils import Cluster
except ImportError:  # pragma: no cover - Ray is the extra [ray]
    if os.environ.get("CI") or os.environ.get("GPUCHECK_RAY_TESTS"):
        raise
    pytest.skip(
        'Ray is not installed (python -m pip install "ray[client]>=2.40")', allow_module_level=True
    )

from gpucheck.controller.config import RunConfig
from gpucheck.controller.fleet import NODE_LABEL, Node, plan_group
from gpucheck.controller.fleet_head import Collector, write_batches
from gpucheck.controller.fleet_node import NodeTargets
from gpucheck.errors import EnvironmentProblem, UsageProblem
from gpucheck.model import results
from gpucheck.model.fleet import NodeLost
from gpucheck.model.layout import RunFolder

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


GPUS = {"node-a": 2, "node-b": 1}


def _node_temp(folder: Path) -> dict[str, str]:
    """The environment that puts the temporary folders of gpucheck's node tasks (their
    workers' files) in ``folder``, not the machine's /tmp, which Ray keeps for its own (the
    paths of its sockets must stay short)."""
    return {"TMPDIR": str(folder), "RAY_TMPDIR": tempfile.gettempdir()}


@pytest.fixture(scope="module")
def node_tmp(tmp_path_factory) -> Path:
    """The temporary folder of the module's Ray nodes (where their node tasks' folders go)."""
    return tmp_path_factory.mktemp("ray_nodes")


def _node_folders(node_tmp: Path) -> set[Path]:
    return set(node_tmp.glob("gpucheck-node-*"))


@pytest.fixture(scope="module")
def ray_cluster(node_tmp):
    """A head without GPUs and two nodes that declare some (node-a: 2, node-b: 1), for the
    module (a cluster takes seconds to start); its processes (node-b's, when it is added
    again, too) put their temporary folders in ``node_tmp``."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in _node_temp(node_tmp).items():
            env.setenv(name, value)
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        nodes = {name: _node(c, name, gpus) for name, gpus in GPUS.items()}
        c.wait_for_nodes()
        yield c, nodes
        c.shutdown()


@pytest.fixture
def cluster(ray_cluster):
    """The module's cluster with both its nodes (one a test removed is added again)."""
    c, nodes = ray_cluster
    for name, node in list(nodes.items()):
        if node not in c.list_all_nodes():
            nodes[name] = _node(c, name, GPUS[name])
    c.wait_for_nodes()
    return c, nodes


def _verdict_last(said: str, verdict: str) -> None:
    """The console's last line is gpucheck's verdict; no line of Ray's own is on it (they
    are in the run folder's ray.log)."""
    lines = said.strip().splitlines()
    assert lines[-1].startswith(verdict), lines[-3:]
    for noise in ("(run_node", "(run_group", "\x1b[", "(raylet", "Check failed", "(pid="):
        assert noise not in said, (noise, said)


def _run(cwd: Path, address: str, *args: str) -> subprocess.Popen[str]:
    """``gpucheck run --quiet --ray ADDRESS ARGS`` started without a GPU, its output and
    errors on one pipe."""
    return start(
        "run", "--quiet", "--ray", address, *args, cwd=cwd, env=NO_GPU, stderr=subprocess.STDOUT
    )


def _lost(out: Path) -> list[NodeLost]:
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    found = [NodeLost.from_json(r) for r in lines if r.get("record") == "lost"]
    return [x for x in found if x is not None]


def _resumed_with_node_b(c, nodes, cwd: Path, verdict: str) -> Counter:
    """node-b back (a rebooted node keeps its label), the run in ``cwd/run`` resumed: its
    verdict last on the console; (device, mode, case) of every case record, each once."""
    nodes["node-b"] = _node(c, "node-b", GPUS["node-b"])
    c.wait_for_nodes()
    proc = _run(cwd, c.address, "--resume", "run")
    said, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, said
    _verdict_last(said, verdict)
    keys = Counter((r["device"], r["mode"], r["case"]) for r in cases(cwd / "run"))
    assert set(keys.values()) == {1}, keys  # every case once
    return keys


def test_a_suite_runs_on_every_node_into_one_report(cluster, node_tmp, tmp_path: Path) -> None:
    """Each case once on each node, one run folder and report; test_fails failed on each
    node, so each keeps its workers' files (in the nodes' temporary folder), and a note
    says where."""
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
    _verdict_last(said, "failed (exit 1): 16 case(s)")
    assert "(run_node" in (out / "ray.log").read_text()  # the nodes' own lines, kept there
    kept = re.findall(r"note: node-[ab]: its workers' files \(logs, state\) are in (\S+) on", said)
    assert len(kept) == 2 and all(Path(k).parent == node_tmp and Path(k).is_dir() for k in kept)


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
    before_recs = cases(out)
    assert Counter(r["device"] for r in before_recs) == {"node-a/cpu": 4, "node-b/cpu": 2}

    _verdict_last(said, "interrupted (exit 130)")

    keys = _resumed_with_node_b(c, nodes, tmp_path, "passed (exit 0): 8 case(s)")
    assert Counter(d for d, _, _ in keys) == {"node-a/cpu": 4, "node-b/cpu": 4}
    added = set(keys) - {(r["device"], r["mode"], r["case"]) for r in before_recs}
    assert sorted(added) == sorted(lost[0].cases)  # exactly what the lost record named
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["verdict"] == "passed"


def test_without_ray_the_run_says_how_to_get_it(tmp_path: Path) -> None:
    make_suite(tmp_path)
    hidden = tmp_path / "no_ray" / "ray"  # `import ray` fails, as where it is not installed
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    path = os.pathsep.join(p for p in (str(hidden.parent), os.environ.get("PYTHONPATH")) if p)
    proc = gpucheck(
        "run", "--cpu-only", "--ray", "--suite", "demo", cwd=tmp_path, env={"PYTHONPATH": path}
    )
    assert proc.returncode == 2, proc.stderr
    assert 'python -m pip install "ray[client]>=2.40"' in proc.stderr
    assert not (tmp_path / "reports").exists()


def test_the_collector_keeps_batches_until_they_are_taken_into_the_run_folder(tmp_path):
    collector = Collector()
    collector.append("results", b'{"a":1}\n')
    collector.append("rerun", b'{"r":1}\n')
    collector.append("results", b'{"b":2}\n{"c":3}\n')
    write_batches(RunFolder(tmp_path), collector.take())
    assert collector.take() == []
    assert (tmp_path / "results.jsonl").read_text() == '{"a":1}\n{"b":2}\n{"c":3}\n'
    assert (tmp_path / "rerun.jsonl").read_text() == '{"r":1}\n'


def test_cpu_only_runs_on_a_ray_instance_without_gpus_and_says_what_it_leaves_out(tmp_path):
    """``--ray`` without an address starts a local Ray instance: here one without any GPU,
    where ``--cpu-only`` runs on its one node (it was refused: "no node has a GPU"). The
    default suites, as the local --cpu-only run's, each left out named in one line (those
    that need a GPU; the distributed suite, which is --ray --distributed's); the console ends
    with the verdict."""
    proc = start(
        "run", "--quiet", "--ray", "--cpu-only", "--out", "run", "--", "-k", "truncated_file",
        cwd=tmp_path, env={**NO_GPU, "RAY_ADDRESS": "", **_node_temp(tmp_path)},
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    said, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, said
    _verdict_last(said, "passed (exit 0): 1 case(s)")
    (device,) = {r["device"] for r in cases(tmp_path / "run")}
    assert device.endswith("/cpu")
    notes = [line for line in said.splitlines() if line.startswith("note: --")]
    assert any("suites knn, splat, ssim test CUDA kernels" in n for n in notes), notes
    assert any("the distributed suite (dist) was not run" in n for n in notes), notes


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


def test_the_distributed_suite_runs_as_one_group_over_the_nodes(cluster, node_tmp, tmp_path):
    """node-a declares 2 GPUs, node-b 1: three gloo ranks, 0 and 1 on node-a, 2 on node-b,
    one group (its collectives span the nodes), one run folder on the head; nothing failed,
    so nothing is left on the nodes."""
    c, _ = cluster
    before = _node_folders(node_tmp)
    code, said, recs = _dist(tmp_path, c.address, "dist")
    assert code == 0, said
    # every case passed: the nodes removed their ranks' files, and no note names them
    assert _node_folders(node_tmp) == before and "ranks' files" not in said
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
    for node in ("node-a", "node-b"):  # both were stopped: both keep their ranks' files
        assert f"note: {node}: its ranks' files (logs, state, stacks) are in " in said


#: the group meets in test_first and test_last (dist_rank: a case boundary of the group); in
#: between, rank 2 (node-b) takes 10x longer a case than ranks 0 and 1, which then wait for
#: it at test_last's start
SKEWED = {
    "test_dist_skew.py": textwrap.dedent("""
        import os, time, pytest

        def test_first(dist_rank):
            pass

        @pytest.mark.parametrize("i", range(4))
        def test_skew(i):
            time.sleep(1.5 if os.environ["RANK"] == "2" else 0.1)

        def test_last(dist_rank):
            pass
    """)
}


def test_a_node_lost_mid_group_stops_the_group_and_resume_runs_each_ranks_cases(
    cluster, tmp_path
) -> None:
    """node-b (rank 2) is lost while rank 2 is behind in test_skew and ranks 0 and 1 wait
    for it at test_last: the head stops node-a's ranks at once (they would wait for rank 2
    until the timeout), and records node-b lost with the cases its loss left without a
    record, every rank's (the group stopped with it); the run ends interrupted. node-b back,
    --resume runs exactly those: each rank's six cases recorded once, passed."""
    c, nodes = cluster
    make_suite(tmp_path, SKEWED)
    out = tmp_path / "run"
    proc = _start_dist(tmp_path, c.address, "demo")
    deadline = time.time() + 180
    while True:  # ranks 0 and 1 at test_last, rank 2 in its second test_skew or later
        done = Counter(r["device"] for r in cases(out))
        if done[RANKS[0]] == done[RANKS[1]] == 5 and 2 <= done[RANKS[2]] < 5:
            break
        assert proc.poll() is None, proc.communicate()[0]
        assert time.time() < deadline, f"the ranks did not get apart: {done}"
        time.sleep(0.1)
    c.remove_node(nodes["node-b"])
    t0 = time.monotonic()
    said, _ = proc.communicate(timeout=300)
    assert time.monotonic() - t0 < 30  # not the 60 s timeout
    assert proc.returncode == 130, said
    _verdict_last(said, "interrupted (exit 130)")
    before = {(r["device"], r["mode"], r["case"]) for r in cases(out)}
    lost = _lost(out)
    assert [x.node for x in lost] == ["node-b"]
    missing = sorted(lost[0].cases)
    assert {d for d, _, _ in missing} == set(RANKS)
    assert [c for d, _, c in missing if d != RANKS[2]] == ["test_dist_skew.py::test_last"] * 2
    end = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()][-1]
    assert end["record"] == "end" and end["interrupted"] and "node-b" in end["reason"]
    assert "node-a: the group's ranks here were stopped: node node-b did not finish" in said

    keys = _resumed_with_node_b(c, nodes, tmp_path, "passed (exit 0): 18 case(s)")
    assert Counter(d for d, _, _ in keys) == dict.fromkeys(RANKS, 6)
    assert sorted(set(keys) - before) == missing  # exactly what the lost record named


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
