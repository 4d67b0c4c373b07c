"""``gpucheck merge``: the shards of a plan merged are the unsharded run (its cases, counts
and verdict); folders that differ in version or settings, unfinished runs and a case on one
device twice are refused in one sentence naming the difference and the folders; a merge
without every shard of the plan, or without a record of every case a shard planned, is
refused naming what is missing, or with --allow-incomplete is incomplete (exit 2), never
passed; its own time is its parts' and its own, not the time between."""

from __future__ import annotations

import json
import shutil
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from clirun import NO_GPU, gpucheck
from fleet import cases, keys, make_suite

from gpucheck import cli
from gpucheck.model.runlog import RunLog

RUN = ("run", "--quiet", "--cpu-only", "--suite", "demo")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One project with the unsharded run (all/) and its two shards (s1/, s2/)."""
    root = tmp_path_factory.mktemp("merge")
    make_suite(root)
    for out, extra in (("all", ()), ("s1", ("--shard", "1/2")), ("s2", ("--shard", "2/2"))):
        proc = gpucheck(*RUN, "--out", out, *extra, cwd=root, env=NO_GPU, timeout=300)
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return root


def _summary(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["summary"]


def _edit(src: Path, dst: Path, edit) -> Path:
    """A copy of run folder ``src`` whose records went through ``edit`` (a function of a
    record, in place)."""
    shutil.copytree(src, dst)
    lines = [json.loads(x) for x in (dst / "results.jsonl").read_text().splitlines()]
    for record in lines:
        edit(record)
    (dst / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return dst


def test_merged_shards_equal_the_unsharded_run(runs: Path) -> None:
    proc = gpucheck("merge", "s1", "s2", "--out", "merged", cwd=runs, env=NO_GPU)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # test_fails fails, as unsharded
    assert "Traceback" not in proc.stderr
    merged = runs / "merged"
    assert keys(merged) == keys(runs / "all")
    want, got = _summary(runs / "all"), _summary(merged)
    fields = ("verdict", "cases", "by_status", "findings", "by_kind", "devices", "modes")
    assert {f: got[f] for f in fields} == {f: want[f] for f in fields}
    assert got["cases"] == 8 and got["by_status"] == {"passed": 6, "failed": 1, "skipped": 1}
    for name in ("report.html", "junit.xml", "results.json"):
        assert (merged / name).is_file()
    header = json.loads((merged / "results.jsonl").read_text().splitlines()[0])
    assert header["config"]["merged_from"] == [str((runs / s).resolve()) for s in ("s1", "s2")]
    assert header["config"]["shard"] is None
    run_ids = {r["run_id"] for r in map(json.loads, (merged / "results.jsonl").open())}
    assert run_ids == {header["run_id"]}


def test_a_case_in_two_folders_is_refused(runs: Path, tmp_path, capsys) -> None:
    again = _edit(runs / "all", tmp_path / "again", lambda r: None)  # the same cases, same host
    assert cli.main(["merge", str(runs / "all"), str(again)]) == 2
    err = capsys.readouterr().err
    assert "is in both" in err and str(runs / "all") in err and str(again) in err
    assert "on cpu" in err
    assert cli.main(["merge", str(runs / "s1"), str(runs / "all")]) == 2  # 1/2 with unsharded
    assert "shard count is '2'" in capsys.readouterr().err
    assert cli.main(["merge", str(runs / "s1"), str(runs / "s1")]) == 2
    assert "named twice" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("what", "edit", "words"),
    [
        ("version", lambda r: r.update(gpucheck_version="0.0.1"), "gpucheck version is"),
        ("modes", lambda r: r["config"].update(modes=["nvml"]), "modes is"),
        ("pytest", lambda r: r["config"].update(pytest_args=["-k", "x"]), "pytest_args is"),
        ("detectors", lambda r: r.update(detectors={"disabled": ["leak"]}), "detectors is"),
        ("shards", lambda r: r["config"].update(shard="2/3"), "shard count is"),
    ],
)
def test_runs_of_other_settings_are_refused(runs: Path, tmp_path, capsys, what, edit, words):
    other = _edit(runs / "s2", tmp_path / what, lambda r: r.get("record") == "run" and edit(r))
    assert cli.main(["merge", str(runs / "s1"), str(other), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpucheck: cannot merge runs with different settings: " + words), err
    assert str(runs / "s1") in err and str(other) in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "m").exists()


def test_the_same_shard_twice_and_an_interrupted_run_are_refused(runs, tmp_path, capsys):
    again = _edit(runs / "s1", tmp_path / "again", lambda r: None)
    assert cli.main(["merge", str(runs / "s1"), str(again)]) == 2
    assert "shard 1/2 is in both" in capsys.readouterr().err
    stopped = _edit(
        runs / "s2",
        tmp_path / "stopped",
        lambda r: r.get("record") == "end" and r.update(interrupted=True),
    )
    assert cli.main(["merge", str(runs / "s1"), str(stopped)]) == 2
    err = capsys.readouterr().err
    assert "its run was interrupted" in err and f"gpucheck run --resume {stopped}" in err


def test_hosts_that_name_devices_alike_get_their_host_in_the_name(runs, tmp_path) -> None:
    other = _edit(
        runs / "s2", tmp_path / "other", lambda r: r.get("record") == "run" and r.update(host="b")
    )
    out = tmp_path / "m"
    assert cli.main(["merge", str(runs / "s1"), str(other), "--out", str(out)]) == 1
    host = json.loads((runs / "s1" / "results.jsonl").read_text().splitlines()[0])["host"]
    assert {d for d, *_ in keys(out)} == {f"{host}/cpu", "b/cpu"}
    assert len(keys(out)) == len(keys(runs / "all"))


def test_a_merged_run_cannot_be_resumed(runs: Path, tmp_path, capsys) -> None:
    out = tmp_path / "m"
    assert cli.main(["merge", str(runs / "s1"), str(runs / "s2"), "--out", str(out)]) == 1
    capsys.readouterr()
    assert cli.main(["run", "--resume", str(out)]) == 2
    assert "was made by `gpucheck merge`" in capsys.readouterr().err


def _without(src: Path, dst: Path, drop) -> Path:
    """A copy of run folder ``src`` without the records ``drop`` (a function of a record)
    says to leave out."""
    shutil.copytree(src, dst)
    lines = [json.loads(x) for x in (dst / "results.jsonl").read_text().splitlines()]
    (dst / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines if not drop(r)))
    return dst


def test_a_missing_shard_is_refused_or_merged_as_incomplete(runs: Path, tmp_path, capsys):
    """A CI job whose artifact never came: the merge of shard 2/2 alone (its cases all pass)
    names shard 1/2 in one sentence and writes nothing; with --allow-incomplete its report
    says incomplete (exit 2), never passed, and results.json's state is not complete."""
    out = tmp_path / "m"
    assert cli.main(["merge", str(runs / "s2"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("gpucheck: cannot merge: shard 1/2 of the plan is missing: the ")
    assert f"2/2 ({str(runs / 's2')!r})" in err and "--allow-incomplete" in err
    assert not out.exists()
    proc = gpucheck("merge", "s2", "--out", str(out), "--allow-incomplete", cwd=runs, env=NO_GPU)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith("incomplete (exit 2): ")
    doc = json.loads((out / "results.json").read_text())
    assert doc["summary"]["verdict"] == "incomplete" and doc["state"]["complete"] is False
    assert any("shard 1/2 of the plan is missing" in why for why in doc["summary"]["why"])
    header = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert [p["shard"] for p in header["parts"]] == ["2/2"]  # the fact, in the record
    # the folder's verdict, whoever reads it
    again = gpucheck("report", str(out), cwd=runs, env=NO_GPU)
    assert again.returncode == 2 and "shard 1/2" in again.stdout


def test_a_planned_case_without_a_record_is_refused_or_merged_as_incomplete(runs, tmp_path):
    """A shard whose folder lost a case record (its worker planned it: its plan record says
    so) is named with the case; with --allow-incomplete the merged run is not complete (and
    never passed)."""
    (lost,) = [r["case"] for r in cases(runs / "s2") if r["status"] == "passed"][:1]
    lossy = _without(runs / "s2", tmp_path / "s2", lambda r: r.get("case") == lost)
    proc = gpucheck("merge", "s1", str(lossy), "--out", str(tmp_path / "m"), cwd=runs, env=NO_GPU)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    said = proc.stderr.strip()
    assert "1 case(s) that" in said and str(lossy) in said and lost in said, said
    assert "--resume" not in said  # a finished run cannot be resumed: not suggested
    proc = gpucheck(
        *("merge", "s1", str(lossy), "--out", str(tmp_path / "m"), "--allow-incomplete"),
        cwd=runs,
        env=NO_GPU,
    )
    assert proc.returncode in (1, 2), proc.stdout + proc.stderr  # s1's failure, or incomplete
    doc = json.loads((tmp_path / "m" / "results.json").read_text())
    assert doc["state"]["complete"] is False and doc["summary"]["verdict"] != "passed"


def test_merge_messages_name_the_folder_and_suggest_only_what_works(runs, tmp_path, capsys):
    again = str(runs / "s1") + "/"
    assert cli.main(["merge", str(runs / "s1"), str(runs / "s2"), again]) == 2
    err = capsys.readouterr().err
    assert "the run folder" in err and str(runs / "s1") in err and "named twice" in err
    out = tmp_path / "m"
    assert cli.main(["merge", str(runs / "s1"), str(runs / "s2"), "--out", str(out)]) == 1
    capsys.readouterr()
    assert cli.main(["merge", str(runs / "s1"), str(runs / "s2"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already holds a gpucheck run; a new merge needs an empty folder" in err
    assert "--resume" not in err  # a merged folder is never resumed


def test_the_own_time_of_a_merge_counts_its_parts_not_the_time_between(runs, tmp_path):
    """The shards ran an hour before the merge: the merged run's own-time line counts the
    shards' run time and the merge's, not the hour (it said "618.4 s of 620.7 s" for a
    0.3 s merge ten minutes after its shards)."""

    def hour_earlier(record: dict) -> None:
        for key in ("started_at", "finished_at", "resumed_at"):
            if isinstance(record.get(key), str):
                t = datetime.fromisoformat(record[key]) - timedelta(hours=1)
                record[key] = t.isoformat(timespec="milliseconds")

    old = [_edit(runs / s, tmp_path / s, hour_earlier) for s in ("s1", "s2")]
    active = sum(RunLog.read(f / "results.jsonl").invocations()[0][1] for f in old) - sum(
        RunLog.read(f / "results.jsonl").invocations()[0][0] for f in old
    )
    t0 = time.monotonic()
    proc = gpucheck("merge", *map(str, old), "--out", str(tmp_path / "m"), cwd=runs, env=NO_GPU)
    took = time.monotonic() - t0
    line = next(x for x in proc.stdout.splitlines() if x.startswith("gpucheck's own time:"))
    wall = float(line.split(" of ")[1].split(" s")[0])
    assert active <= wall <= active + took + 1.0, (line, active, took)
