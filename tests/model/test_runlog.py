"""What a run's records say of its completeness and its time: the ``plan`` record of each
worker and the cases planned without a record (a distributed group's fault record standing
for all its ranks), the shards a merged run lacks, and the time each invocation of a resumed
run took (not the time between them)."""

from __future__ import annotations

import jsonschema

from gpucheck.model import clock, results
from gpucheck.model.group import GroupRecord
from gpucheck.model.results import CaseRecord
from gpucheck.model.runlog import CasePlan, Resume, RunEnd, RunLog, RunPart, missing_shards

T0 = 1_800_000_000.0


def _header(at: float) -> dict:
    return {
        "schema": results.SCHEMA_ID,
        "record": "run",
        "run_id": "r",
        "started_at": clock.iso(at),
        "gpucheck_version": "0.1.0",
        "devices": [],
        "suites": ["s"],
        "modes": ["dist"],
    }


def _case(device: str, case: str, **kw) -> dict:
    return CaseRecord("r", device, "s", case, "dist", "passed", **kw).to_json()


def test_a_plan_record_reads_back_and_matches_the_schema(tmp_path) -> None:
    plan = CasePlan("r", "rank1/cpu", "dist", {"s": ["t.py::a", "t.py::b"], "u": ["x.py::c"]})
    jsonschema.validate(plan.to_json(), results.schema())
    path = tmp_path / "results.jsonl"
    results.append(path, _header(T0))
    results.append(path, plan.to_json())
    results.append(path, {**plan.to_json(), "cases": "not a map"})  # someone else's
    log = RunLog.read(path)
    assert log.plans == [plan] and log.unreadable == 1
    assert plan.planned()[-1] == ("rank1/cpu", "u", "x.py::c", "dist")


def test_a_case_planned_and_not_recorded_is_named_and_a_group_record_stands_for_all(tmp_path):
    path = tmp_path / "results.jsonl"
    results.append(path, _header(T0))
    for rank in (0, 1):
        plan = CasePlan("r", f"rank{rank}/cpu", "dist", {"s": ["t::a", "t::b", "t::c"]})
        results.append(path, plan.to_json())
    for device, case in (("rank0/cpu", "t::a"), ("rank1/cpu", "t::a"), ("rank0/cpu", "t::c")):
        results.append(path, _case(device, case))
    # the watchdog's one record of a fault in t::b, on the culprit rank: done for both
    results.append(path, _case("rank1/cpu", "t::b", distributed=GroupRecord("hang", [1], [0])))
    assert RunLog.read(path).unrecorded() == [("rank1/cpu", "s", "t::c", "dist")]


def test_the_shards_a_merged_run_lacks() -> None:
    def parts(*shards: str | None) -> list[RunPart]:
        return [RunPart(f"/f{i}", "h", s) for i, s in enumerate(shards)]

    assert missing_shards(parts("1/3", "2/3")) == ["3/3"]
    assert missing_shards(parts("2/2")) == ["1/2"]
    assert missing_shards(parts("1/2", "2/2")) == []
    assert missing_shards(parts(None, None)) == []  # runs of several machines, not shards
    assert RunPart.from_json({"folder": "/f", "shard": 3, "active_s": -1}) == RunPart("/f")


def test_each_invocation_of_a_resumed_run_counts_its_own_time(tmp_path) -> None:
    """Ten seconds, an hour of nothing, then a resume of five: two invocations of 10 and 5
    seconds; one whose controller died (no end record) lasts to its last case's end."""
    path = tmp_path / "results.jsonl"
    results.append(path, _header(T0))
    results.append(path, _case("rank0/cpu", "t::a", started_at=clock.iso(T0 + 2)))
    results.append(path, RunEnd("r", clock.iso(T0 + 10), True).to_json())
    results.append(path, Resume("r", clock.iso(T0 + 3600)).to_json())
    results.append(path, _case("rank0/cpu", "t::b", started_at=clock.iso(T0 + 3601)))
    results.append(path, RunEnd("r", clock.iso(T0 + 3605)).to_json())
    results.append(path, Resume("r", clock.iso(T0 + 7200)).to_json())
    results.append(
        path, _case("rank0/cpu", "t::c", started_at=clock.iso(T0 + 7201), duration_s=2.0)
    )
    spans = RunLog.read(path).invocations()
    assert [(round(a - T0), round(b - T0)) for a, b in spans] == [
        (0, 10),
        (3600, 3605),
        (7200, 7203),
    ]
