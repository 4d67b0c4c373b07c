"""benchmarks/harness_cost.py's per-case comparison: each case of gpucheck's records matched to
pytest's own duration of it in pytest's JUnit XML (which names modules by dotted path), on a
recorded pair from an H200, and the commands of its variants."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "run_h200_suites"


@pytest.fixture(scope="module")
def hc():
    spec = importlib.util.spec_from_file_location(
        "harness_cost", ROOT / "benchmarks" / "harness_cost.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def recorded(tmp_path):
    run = tmp_path / "gpucheck.0"
    run.mkdir()
    (run / "results.jsonl").write_bytes(
        gzip.decompress((FIXTURE / "results.jsonl.gz").read_bytes())
    )
    junit = tmp_path / "pytest-clb.0.junit.xml"
    junit.write_bytes(gzip.decompress((FIXTURE / "pytest_clb.junit.xml.gz").read_bytes()))
    return run, junit


def test_every_recorded_case_finds_its_pytest_duration(hc, recorded):
    run, junit = recorded
    pc = hc.per_case([run], [junit], top=5)
    assert pc["matched"] == pc["cases"] == 426
    assert len(pc["top"]) == 5
    extras = [r["extra_s"] for r in pc["top"]]
    assert extras == sorted(extras, reverse=True)
    for r in pc["top"]:
        assert r["extra_s"] == pytest.approx(r["gpucheck_s"] - r["pytest_s"])
    assert pc["extra_s"] == pytest.approx(pc["gpucheck_s"] - pc["pytest_s"])
    assert 0 < pc["median_extra_s"] <= min(extras)  # a typical case, below the costliest
    durations = hc.junit_durations(junit)
    assert len(durations) == 426 and all(t >= 0 for t in durations.values())


def test_each_cases_extra_is_split_into_what_its_record_counts_and_the_rest(hc, recorded):
    """Counted: the record's ``cost_s`` (detectors and bookkeeping); uncounted: the rest of the
    extra. By suite, the same sums, and pytest's own sum of the suite's cases each round."""
    run, junit = recorded
    pc = hc.per_case([run, run], [junit, junit], top=426)
    costs = {
        f"{r['suite']}/{r['case']}": sum(r["cost_s"].values())
        for r in hc.passes(hc.read_records(run))[0]
    }
    assert 0 < pc["counted_s"] == pytest.approx(sum(costs.values()))
    for r in pc["top"]:
        assert r["counted_s"] == pytest.approx(costs[r["case"]])
        assert r["uncounted_s"] == pytest.approx(r["extra_s"] - r["counted_s"])
        assert r["pytest_range_s"] == [r["pytest_s"], r["pytest_s"]]
    suites = pc["suites"]
    assert sum(x["cases"] for x in suites.values()) == 426
    for key in ("extra_s", "counted_s", "uncounted_s", "pytest_s"):
        assert sum(x[key] for x in suites.values()) == pytest.approx(pc[key])
    for x in suites.values():
        assert x["pytest_rounds_s"] == pytest.approx([x["pytest_s"], x["pytest_s"]])
    lines = hc.suite_lines("gpucheck", suites, "pytest-clb")
    knn = suites["knn"]
    assert f"| knn | {knn['cases']} | {knn['gpucheck_s']:.2f} |" in "\n".join(lines)


def test_a_missing_junit_file_matches_nothing(hc, recorded, tmp_path):
    run, _ = recorded
    pc = hc.per_case([run], [tmp_path / "absent.xml"])
    assert pc["matched"] == 0 and pc["cases"] == 426 and pc["top"] == []


@pytest.mark.parametrize(
    ("junit_id", "case", "same"),
    [
        ("suites.knn.test_knn::test_a[cuda0-1.5]", "test_knn.py::test_a[cuda0-1.5]", True),
        ("tests.sub.test_m.TestC::test_y[0.5-a.b]", "sub/test_m.py::TestC::test_y[0.5-a.b]", True),
        ("tests.sub.test_m.TestD::test_y[0.5-a.b]", "sub/test_m.py::TestC::test_y[0.5-a.b]", False),
        ("tests.sub.test_n.TestC::test_y[1]", "sub/test_m.py::TestC::test_y[1]", False),
        ("suites.knn.test_knn::test_a[1]", "test_knn.py::test_a[2]", False),
    ],
)
def test_ids_are_matched_on_their_last_parts(hc, junit_id, case, same):
    assert hc.same_case(junit_id, case) is same


def test_the_variants_commands(hc, tmp_path):
    args, extra = hc.parse([str(tmp_path), "--suite", "knn"])
    plain = hc.command("pytest-clb", args, extra, tmp_path / "pytest-clb.0")
    assert f"--junitxml={tmp_path / 'pytest-clb.0'}.junit.xml" in plain
    assert plain[:3] == [sys.executable, "-m", "pytest"]
    every = hc.command("pytest-clb-all", args, extra, tmp_path / "x")
    assert not any(a.startswith("--junitxml") for a in every)  # one process per GPU, one file
    blocking = hc.command("gpucheck-blocking", args, extra, tmp_path / "b")
    assert blocking[blocking.index("--mode") + 1] == "blocking"
    assert "--mode" not in hc.command("gpucheck", args, extra, tmp_path / "g")


def test_the_table_compares_every_variant_case_by_case(hc, recorded, tmp_path):
    """One line per gpucheck variant (its cases, pytest's, the extra, the median extra a case),
    then the default run's costliest cases."""
    run, junit = recorded
    pc = hc.per_case([run], [junit], top=3)
    blocking = dict(pc, extra_s=1.5, median_extra_s=0.0042)
    result = {
        "device": "NVIDIA H200",
        "suites": ["knn"],
        "rounds": 1,
        "median_wall": {"pytest-clb": 70.0, "gpucheck-blocking": 75.0, "gpucheck": 80.0},
        "round_ratios": {"gpucheck-blocking": [1.07], "gpucheck": [1.14]},
        "breakdown": {},
        "per_case": {"gpucheck-blocking": blocking, "gpucheck": pc},
    }
    lines = hc.table(result, cpu_only=False).splitlines()
    assert "| gpucheck | 80.00 | 1.14x | 1.14 (1.14x) |" in lines
    rows = [x for x in lines if x.startswith(("| gpucheck-blocking | 426", "| gpucheck | 426"))]
    assert rows[0].split(" | ")[-2:] == ["1.50", "4.2 |"]
    assert rows[1].split(" | ")[3:5] == [f"{pc['pytest_s']:.2f}", f"{pc['extra_s']:.2f}"]
    assert "the cases gpucheck took longest over pytest-clb:" in lines
    assert lines[-1].startswith(f"| {pc['top'][-1]['case']} |")


def test_one_device_pytest_targets_the_device_gpucheck_runs_on(hc, monkeypatch):
    """Left alone, plain pytest runs every case once per visible GPU (852 cases against
    gpucheck's 426 on two H200s): its one-device variants target device 0, as ``gpucheck run
    --device 0`` does; a GPUCHECK_DEVICES of the caller's reaches no variant; without a GPU
    nothing is targeted (device 0 would not be visible)."""
    monkeypatch.setenv("GPUCHECK_DEVICES", "1")
    for v in ("pytest", "pytest-clb"):
        assert hc.environment(v, gpu=True)["GPUCHECK_DEVICES"] == "0"
        assert "GPUCHECK_DEVICES" not in hc.environment(v, gpu=False)
    for v in ("pytest-clb-all", "gpucheck", "gpucheck-all", "gpucheck-nodet"):
        assert "GPUCHECK_DEVICES" not in hc.environment(v, gpu=True)
    clb = hc.environment("pytest-clb", gpu=True)
    assert clb["CUDA_LAUNCH_BLOCKING"] == "1" and clb["GPUCHECK_DISABLE_DETECTORS"] == "all"
    assert "GPUCHECK_DISABLE_DETECTORS" not in hc.environment("gpucheck", gpu=True)


def test_plain_pytest_on_every_gpu_gets_gpucheck_workers_share_of_the_cpus(
    hc, monkeypatch, tmp_path
):
    """``pytest-clb-all`` starts a process per visible GPU, each with its own
    CUDA_VISIBLE_DEVICES and the OMP_NUM_THREADS gpucheck gives each of its workers (two
    plain pytest processes with a thread per CPU each took 221 s where one took 65 s a
    device, on two H200s)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(hc, "visible_gpus", lambda: ["0", "1"])
    seen = []

    class Proc:
        def __init__(self, cmd, env, stdout, stderr):
            seen.append(env)

        def wait(self):
            return 0

    monkeypatch.setattr(hc.subprocess, "Popen", Proc)
    assert hc.run_variant(["true"], "pytest-clb-all", tmp_path / "x", gpu=True) == 0
    assert [e["CUDA_VISIBLE_DEVICES"] for e in seen] == ["0", "1"]
    share = hc.thread_share(2)["OMP_NUM_THREADS"]
    assert all(e["OMP_NUM_THREADS"] == share for e in seen)
    assert (tmp_path / "x.gpu0.log").exists() and (tmp_path / "x.gpu1.log").exists()


def test_each_round_is_a_pair_and_every_round_is_kept(hc, monkeypatch, tmp_path, capsys):
    """Runs stood in for (no GPU): the rounds' ratios are paired (each gpucheck run over the
    pytest run of its round) with their median in the table; harness_cost.json is there after
    the first round already, so a run cut in its second keeps the first."""
    walls = iter([10.0, 11.0, 10.0, 12.5])  # round 0: pytest-clb, gpucheck; round 1: reversed
    clock = [0.0]

    def fake_time():
        return clock[0]

    def fake_run(cmd, variant, out, gpu):
        clock[0] += next(walls)
        return 0

    monkeypatch.setattr(hc.time, "time", fake_time)
    monkeypatch.setattr(hc, "run_variant", fake_run)
    monkeypatch.setattr(hc.subprocess, "run", lambda *a, **k: None)  # the collect-only warm-up
    monkeypatch.setattr(hc, "device_name", lambda cpu_only: "NVIDIA H100")
    written = []
    real_write = Path.write_text

    def write_text(self, text, *a, **k):
        if self.name == "harness_cost.json":
            written.append(json.loads(text))
        return real_write(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", write_text)
    out = tmp_path / "hc"
    hc.main([str(out), "--rounds", "2", "--only", "pytest-clb", "--only", "gpucheck"])
    assert [w["rounds"] for w in written] == [1, 2]
    assert written[0]["round_ratios"] == {"gpucheck": [1.1]}
    last = written[-1]
    assert last["walls"] == {"pytest-clb": [10.0, 12.5], "gpucheck": [11.0, 10.0]}
    assert last["round_ratios"]["gpucheck"] == [1.1, 0.8]
    assert "| gpucheck | 10.50 | 0.93x | 1.10, 0.80 (0.95x) |" in capsys.readouterr().out
