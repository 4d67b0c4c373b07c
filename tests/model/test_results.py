"""results.jsonl writing/reading and JUnit conversion on hand-made records."""

from __future__ import annotations

import multiprocessing
import xml.etree.ElementTree as ET

import jsonschema
import pytest
import recordkit

from gpucheck.model import results
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.report import junit


def _record(case, status, findings=()):
    return CaseRecord(
        run_id="r1",
        device="cuda:1",
        suite="ssim",
        case=case,
        mode="blocking",
        status=status,
        findings=list(findings),
    ).to_json()


def test_append_is_one_line_per_record_and_survives_a_torn_tail(tmp_path):
    path = tmp_path / "results.jsonl"
    results.append(path, _record("a.py::t1", "passed"))
    results.append(path, _record("a.py::t2", "skipped"))
    with open(path, "a") as f:
        f.write('{"record": "case", "cas')  # a writer killed mid-line
    assert [r["case"] for r in results.cases(path)] == ["a.py::t1", "a.py::t2"]


def test_case_records_are_synced_at_most_once_a_second_every_other_record_at_once(
    tmp_path, monkeypatch
):
    synced = []
    monkeypatch.setattr(results.os, "fsync", lambda fd: synced.append(fd))
    path = tmp_path / "results.jsonl"
    for i in range(20):
        results.append(path, _record(f"a.py::t{i}", "passed"))
    assert len(synced) == 1  # the first case record: one fsync, not twenty
    results.append(path, {"record": "end", "run_id": "r1"})
    assert len(synced) == 2  # the end record (and every case record before it) on disk
    monkeypatch.setattr(results, "SYNC_INTERVAL_S", 0.0)
    results.append(path, _record("a.py::late", "passed"))
    assert len(synced) == 3
    assert len(path.read_text().splitlines()) == 22


def _writer(path, worker):
    for i in range(50):
        results.append(
            path, _record(f"w{worker}.py::t{i}", "passed", [Finding("x", "info", "m" * 3000)])
        )


def test_concurrent_writers_do_not_interleave(tmp_path):
    path = tmp_path / "results.jsonl"
    procs = [multiprocessing.Process(target=_writer, args=(path, w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    recs = results.cases(path)
    assert len(recs) == 200
    assert len(path.read_text().splitlines()) == 200


def test_schema_accepts_records_and_rejects_bad_ones():
    schema = results.schema()
    good = _record("a.py::t", "failed", [Finding("test-failure", "error", "boom", device="cuda:1")])
    jsonschema.validate(good, schema)
    for bad in (
        {**good, "status": "exploded"},
        {k: v for k, v in good.items() if k != "mode"},
        {**good, "findings": [{"kind": "x"}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_errors_are_the_findings_of_severity_error():
    warned = CaseRecord.from_json(_record("a", "passed", [Finding("x", "warning", "w")]))
    crashed = CaseRecord.from_json(_record("a", "crashed", [Finding("crash", "error", "died")]))
    assert warned is not None and crashed is not None
    assert warned.errors() == [] and [f.kind for f in crashed.errors()] == ["crash"]


def test_junit_groups_by_device_suite_mode(tmp_path):
    path = tmp_path / "results.jsonl"
    results.append(path, _record("s/t.py::ok", "passed"))
    results.append(
        path, _record("s/t.py::bad", "failed", [Finding("test-failure", "error", "assert 1 == 2")])
    )
    results.append(
        path,
        _record("s/t.py::hang", "hung", [Finding("hang", "error", "stuck", hint="look at stacks")]),
    )
    results.append(path, {**_record("s/t.py::ok", "passed"), "device": "cuda:0"})
    root = ET.parse(junit.write(path, tmp_path / "junit.xml")).getroot()
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {"ssim [cuda:0, blocking]", "ssim [cuda:1, blocking]"}
    s1 = suites["ssim [cuda:1, blocking]"]
    assert (s1.get("tests"), s1.get("failures"), s1.get("errors")) == ("3", "1", "1")
    err = s1.find("testcase[@name='hang']/error")
    assert err.get("type") == "hung" and "hint: look at stacks" in err.text


def test_cost_seconds_round_trip_and_bad_values_are_left_out():
    """``cost_s`` (gpucheck's own seconds in a case) is written only when there is one, read
    back as names to non-negative numbers, and the schema takes it."""
    rec = CaseRecord("r1", "cuda:0", "s", "t", "blocking", "passed", cost_s={"leak": 0.5})
    line = rec.to_json()
    jsonschema.validate(line, results.schema())
    assert CaseRecord.from_json(line).cost_s == {"leak": 0.5}
    assert "cost_s" not in _record("t", "passed")
    line["cost_s"] = {"leak": -1, "numerics": "x", "record": 0.25, "wrong-stream": True}
    assert CaseRecord.from_json(line).cost_s == {"record": 0.25}
    line["cost_s"] = [1, 2]
    assert CaseRecord.from_json(line).cost_s == {}


def test_a_case_record_line_is_its_every_field_and_reads_back_the_same():
    """``to_json`` (shared containers, not deep copies): every field, findings and the typed
    payload (memory, comparisons, a group fault) as objects, the optional lists left out when
    empty; it reads back as the record it was."""
    import dataclasses
    import json

    from gpucheck.model.group import GroupRecord
    from gpucheck.model.memory import Memory
    from gpucheck.model.numerics import Measured
    from gpucheck.model.results import CaseRecord, Finding

    measured = Measured("x", False, [4], "float32", 1e-5, 1e-8, 0.5, 2.0, [3], 1.5, 1.0, 1, 4, 0)
    full = CaseRecord(
        "r1", "cuda:1", "s", "t.py::t", "blocking", "failed", reason="boom", duration_s=1.5,
        started_at="2026-11-29T00:00:00+00:00", device_uuid="GPU-1", current_device="cuda:0",
        memory=Memory(torch_peak_allocated=3, nvml_peak_other_devices={}), exit_code=1,
        signal="SIGSEGV", stderr_tail="tail",
        findings=[Finding("numerics", "error", "differs", op="ns::op", evidence="e", hint="h")],
        fingerprints=["ns::op|a|b|cuda:1"], numerics=[measured],
        distributed=GroupRecord("hang", [1], [0], 3, "all_reduce", 2.5, 2),
        cost_s={"record": 0.1, "op-watch": 0.2},
    )  # fmt: skip
    line = full.to_json()
    assert line == {
        "schema": line["schema"],
        "record": "case",
        **dataclasses.asdict(full),
        "memory": {"torch_peak_allocated": 3, "nvml_peak_other_devices": {}},
    }
    assert line["numerics"][0]["worst_index"] == [3] and line["distributed"]["seq"] == 3
    assert CaseRecord.from_json(json.loads(json.dumps(line))) == full
    bare = CaseRecord("r1", "cpu", "s", "t.py::t", "plain", "passed").to_json()
    assert not {"fingerprints", "numerics", "distributed", "cost_s"} & set(bare)
    assert bare["findings"] == [] and bare["memory"] == {}  # nothing measured: nothing said


@pytest.mark.parametrize("run", recordkit.RUNS)
def test_every_recorded_case_record_reads_back_and_is_written_again_as_it_was(run):
    """The case records of runs recorded on GPUs: each reads back typed and writes the line
    it was, but for the memory peaks left unknown (``null`` then, left out now)."""
    import json

    lines = recordkit.cases(run)
    assert lines
    for line in lines:
        record = CaseRecord.from_json(line)
        assert record is not None
        memory = {k: v for k, v in line["memory"].items() if v is not None}
        assert record.to_json() == {**line, "memory": memory}, record.key
        assert CaseRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_a_cases_finding_is_placed_in_the_case():
    from gpucheck.model.results import CaseInfo

    info = CaseInfo("cuda:1", "knn", "test_knn.py::test_x[cuda1]")
    f = info.finding("leak", "warning", "grows", op="ns::op", evidence="e", hint="h")
    assert f == Finding(
        "leak", "warning", "grows", "cuda:1", "knn", "test_knn.py::test_x[cuda1]", "ns::op", None,
        "e", "h",
    )  # fmt: skip
    record = CaseRecord("r", "cuda:1", "knn", "test_knn.py::test_x[cuda1]", "plain", "passed")
    assert record.info == info


def test_a_workers_record_is_made_in_one_place():
    from gpucheck.model.memory import Memory
    from gpucheck.model.results import CaseData, Origin

    origin = Origin("r1", "rank1/cuda:1", "dist", "GPU-1")
    data = CaseData(["ns::op|a|b|cuda:1"], [], {"numerics": 0.25})
    found = origin.at("s", "t.py::t").finding("numerics", "error", "differs")
    record = origin.record(
        "s", "t.py::t", "failed", reason="differs", duration_s=1.5, memory=Memory(5),
        findings=[found], data=data,
    )  # fmt: skip
    assert record.key == ("rank1/cuda:1", "s", "t.py::t", "dist")
    assert (record.run_id, record.device_uuid, record.status) == ("r1", "GPU-1", "failed")
    assert record.started_at and record.findings == [found] and record.memory == Memory(5)
    assert record.fingerprints == data.fingerprints and record.cost_s == {"numerics": 0.25}
    bare = origin.record("s", "<rank1 after the last case>", "error", started_at="then")
    assert bare.started_at == "then" and bare.memory == Memory() and bare.findings == []


def test_case_data_adds_up_and_a_plugins_dict_is_read_tolerantly():
    from gpucheck.model.numerics import Measured
    from gpucheck.model.results import CaseData

    m = Measured("x", True, [2], "float32", 0.0, 0.0, 0.0, 0.0, None, None, None, 0, 2, 0)
    data = CaseData(cost_s={"a": 1.0})
    data.add(CaseData(["f1"], [m], {"a": 0.5, "b": 2.0}))
    data.add(CaseData.of({"fingerprints": ["f2"], "numerics": [m.to_json(), "junk"]}))
    assert data == CaseData(["f1", "f2"], [m, m], {"a": 1.5, "b": 2.0})
    assert data.to_json()["numerics"] == [m.to_json(), m.to_json()]
    assert CaseData().to_json() == {}
    for junk in (None, [], {"fingerprints": "x", "numerics": 3, "cost_s": {"a": -1, "b": "2"}}):
        assert CaseData.of(junk) == CaseData()
