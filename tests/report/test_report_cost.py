"""What the checks cost (gpucheck.report.cost): the split of a run's wall time between the
cases and gpucheck, on a run recorded on an H200 and on hand-made records."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from gpucheck.model import clock
from gpucheck.model.results import CaseRecord
from gpucheck.report.cost import Cost, cost_line, run_cost

RECORDED = Path(__file__).parents[1] / "fixtures" / "run_h200_suites" / "results.jsonl.gz"


def _recorded() -> tuple[list[dict], list[CaseRecord], float]:
    lines = [json.loads(x) for x in gzip.decompress(RECORDED.read_bytes()).splitlines() if x]
    header = next(x for x in lines if x["record"] == "run")
    end = next(x for x in lines if x["record"] == "end")
    wall = clock.parse(end["finished_at"]) - clock.parse(header["started_at"])
    cases = [CaseRecord.from_json(x) for x in lines if x["record"] == "case"]
    return lines, cases, wall


def test_the_recorded_run_splits_into_cases_and_gpucheck():
    lines, cases, wall = _recorded()
    cost = run_cost(cases, wall)
    # independently: sums over the raw lines
    raw = [x for x in lines if x["record"] == "case"]
    spent = sum(sum(x.get("cost_s", {}).values()) for x in raw)
    body = sum(x["duration_s"] for x in raw) - spent
    assert abs(cost.cases - body) < 1e-6
    assert abs(cost.bookkeeping - sum(x["cost_s"]["record"] for x in raw)) < 1e-6
    assert abs(sum(cost.detectors.values()) + cost.bookkeeping - spent) < 1e-6
    assert max(cost.detectors, key=cost.detectors.get) == "wrong-stream"
    assert cost.reruns == 0  # one GPU: no wrong-device re-run
    assert abs(cost.own - (wall - body)) < 1e-6 and 0 < cost.own < wall
    line = cost_line(cost)
    assert line.startswith(f"gpucheck's own time: {cost.own:.1f} s of {wall:.1f} s (")
    assert "wrong-stream" in line and "records" in line


def _case(device, case, mode, duration, cost_s=None):
    return CaseRecord(
        "r", device, "s", case, mode, "passed", duration_s=duration, cost_s=cost_s or {}
    )


def test_passes_add_up_the_busiest_device_decides_and_repeats_are_gpucheck_s():
    """Devices of a pass run at once (the busiest counts), passes one after another (they add
    up); a pass of cases an earlier pass ran (a sanitizer pass) and the wrong-device re-runs
    are gpucheck's."""
    records = [
        _case("cuda:0", "a", "blocking", 2.0, {"leak": 0.5, "record": 0.1}),
        _case("cuda:0", "b", "blocking", 1.0),
        _case("cuda:1", "a", "blocking", 1.0),
        _case("cuda:1", "b", "blocking", 1.0),
        _case("cuda:0", "a", "sanitizer:memcheck", 4.0),  # the same cases again
        _case("cuda:1", "a", "sanitizer:memcheck", 5.0),
        _case("rank0/cpu", "d", "dist", 3.0, {"record": 0.2}),  # other cases: the user's
        CaseRecord("r", "cuda:1", "s", "<worker>", "blocking", "crashed", duration_s=9.0),
    ]
    reruns = [_case("cuda:1", "a", "wrong-device", 0.5), _case("cuda:0", "a", "control", 0.25)]
    cost = run_cost(records, wall=20.0, reruns=reruns)
    assert abs(cost.cases - (2.4 + 2.8)) < 1e-9  # cuda:0's blocking pass + the dist pass
    assert cost.detectors == {"leak": 0.5} and abs(cost.bookkeeping - 0.3) < 1e-9
    assert cost.reruns == 5.0 + 0.5  # the sanitizer pass's busiest device + the re-runs'
    assert abs(cost.own - (20.0 - 5.2)) < 1e-9
    assert abs(cost.outside_cases - (cost.own - 0.5 - 0.3 - 5.5)) < 1e-9


def test_a_run_without_cases_or_time():
    assert run_cost([], wall=3.0).own == 3.0
    assert "unknown" in cost_line(Cost(wall=0.0, cases=0.0))


def test_a_run_ends_saying_what_its_checks_cost(tmp_path):
    """`gpucheck run` prints, at the end, one line: gpucheck's own seconds of the run, and
    where they went; they are never more than the run's wall time."""
    import re

    from clirun import gpucheck

    suite = tmp_path / "tiny"
    suite.mkdir()
    (suite / "test_tiny.py").write_text(
        "def test_a():\n    assert 1\n\ndef test_b():\n    assert 2\n"
    )
    proc = gpucheck("run", "--cpu-only", "--suite", str(suite), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(
        r"gpucheck's own time: ([\d.]+) s of ([\d.]+) s \((\d+) %\): detectors", proc.stdout
    )
    assert found, proc.stdout
    own, wall = float(found[1]), float(found[2])
    assert 0 < own <= wall and "records" in proc.stdout
