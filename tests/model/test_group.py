"""A distributed group's records (gpucheck.model.group): a rank's collective log as the
worker's writer writes it, read back line by line, a torn or foreign line left out; a group
fault's record written and read back, tolerant of what someone else wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpucheck.distributed.collectives import CollectiveDeviceError, CollectiveLog
from gpucheck.model.group import CollectiveEntry, GroupRecord, read_log


def _logged(tmp_path: Path) -> tuple[Path, list[CollectiveEntry]]:
    """A log the real writer wrote: a case, a collective that returned, one that raised, one
    it refused (a tensor on another device), the case's end, the group lost at its end."""
    path = tmp_path / "rank1.jsonl"
    log = CollectiveLog(path, 1, expected_device="cpu")
    log.case_started("t.py::c", timeout=30)
    log.wrap("all_reduce", lambda t, async_op=False: t)(torch.ones(4), async_op=True)

    def broken(t: torch.Tensor) -> None:
        raise RuntimeError("peer gone\nmore")

    with pytest.raises(RuntimeError):
        log.wrap("broadcast", broken)(torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(CollectiveDeviceError):
        log.wrap("all_gather", lambda t: t)(torch.ones(1, device="meta"))
    log.case_finished("t.py::c", "failed", "RuntimeError: peer gone")
    log.group_lost("t.py::c", "end", "the store is gone")
    return path, read_log(path)


def test_a_log_the_writer_wrote_reads_back_typed(tmp_path: Path) -> None:
    _, entries = _logged(tmp_path)
    assert [(e.ev, e.seq, e.op) for e in entries] == [
        ("case", 0, None),
        ("enter", 1, "all_reduce"),
        ("done", 1, "all_reduce"),
        ("enter", 2, "broadcast"),
        ("error", 2, "broadcast"),
        ("enter", 3, "all_gather"),
        ("error", 3, "all_gather"),
        ("case-end", 3, None),
        ("group-lost", 3, None),
    ]
    case, enter = entries[0], entries[1]
    assert case.case == "t.py::c" and case.timeout == 30.0
    assert (enter.rank, enter.shapes, enter.dtypes, enter.devices) == (
        1,
        [[4]],
        ["float32"],
        ["cpu"],
    )
    assert enter.is_async and enter.case == "t.py::c" and enter.where and enter.t
    assert entries[4].error == "RuntimeError: peer gone"
    assert entries[6].kind == "device" and "got a tensor on meta" in (entries[6].error or "")
    assert (entries[7].outcome, entries[7].error) == ("failed", "RuntimeError: peer gone")
    assert (entries[8].phase, entries[8].error) == ("end", "the store is gone")


def test_each_entry_is_written_again_as_the_writer_wrote_it(tmp_path: Path) -> None:
    path, entries = _logged(tmp_path)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [e.to_json() for e in entries] == lines
    assert [CollectiveEntry.from_json(x) for x in lines] == entries


def test_a_torn_or_foreign_line_is_left_out(tmp_path: Path) -> None:
    path, entries = _logged(tmp_path)
    text = path.read_text()
    foreign = [
        "not json",
        "[1, 2]",
        '{"ev": "jump", "seq": 1}',  # no event the writer writes
        '{"ev": "enter", "op": "all_reduce"}',  # a collective without its number
        '{"ev": "enter", "seq": 4, "shapes": [[1, "2"]]}',
        '{"ev": "done", "seq": 4, "op": 7}',
        '{"ev": "case", "seq": 0, "timeout": "soon"}',
    ]
    path.write_text("\n".join(foreign) + "\n" + text + text.splitlines()[1][:25])
    assert read_log(path) == entries
    assert read_log(tmp_path / "missing.jsonl") == []


def test_a_field_nothing_judges_is_read_loosely() -> None:
    e = CollectiveEntry.from_json({"ev": "done", "seq": 2, "rank": "one", "t": "now"})
    assert e is not None and (e.seq, e.rank, e.t) == (2, None, None)


def test_a_group_fault_record_round_trip_and_someone_elses() -> None:
    record = GroupRecord("rank-crash", [1], [0, 2], 5, "all_reduce", 3.25, 3)
    assert GroupRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    assert GroupRecord.from_json("hang") is None
    odd = GroupRecord.from_json(
        {"kind": 3, "cause_ranks": [1, "2", True], "seq": "5", "time_to_finding_s": -1}
    )
    assert odd == GroupRecord("unknown", [1], [], None, None, 0.0, None)
