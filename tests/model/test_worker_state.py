"""The worker's state file and the records' clock: one writer and one tolerant reader each."""

from __future__ import annotations

import json
import os

from gpucheck.model import clock, worker_state
from gpucheck.model.results import Finding
from gpucheck.model.worker_state import WorkerState


def test_state_round_trips_with_its_pending_findings(tmp_path):
    path = tmp_path / "cuda0.plain.state.json"
    pending = Finding("mixed-devices", "error", "tensors on two devices", op="ext::op")
    state = WorkerState(
        case="test_a.py::test_x[cuda0]",
        suite="ssim",
        current_device="cuda:1",
        op="ext::op",
        started=1700000000.5,
        done=3,
        total=7,
        findings=2,
        pid=os.getpid(),
        exit_reason=worker_state.CONTEXT_LOST,
        sanitizer_offsets={"/run/w.sanitizer.1.log": 120},
        pending_findings=[pending],
    )
    writer = worker_state.StateWriter(path)
    writer.write(state)
    assert worker_state.read(path) == state
    writer.close()


def test_state_reader_turns_bad_fields_into_defaults(tmp_path):
    path = tmp_path / "w.state.json"
    path.write_text(
        json.dumps(
            {
                "case": 5,
                "done": "three",
                "total": -1,
                "findings": True,
                "pid": "123",
                "started": "yesterday",
                "exit_reason": "bored",
                "sanitizer_offsets": {"a.log": -4, "b.log": 7},
                "pending_findings": [{"kind": "x", "severity": "loud", "message": "m"}, 3],
                "from_a_later_version": {"ignored": True},
            }
        )
    )
    state = worker_state.read(path)
    assert state is not None
    assert (state.case, state.done, state.total, state.findings, state.pid) == (
        None,
        0,
        0,
        0,
        None,
    )
    assert state.started is None and state.exit_reason is None
    assert state.sanitizer_offsets == {"b.log": 7}
    assert [f.severity for f in state.pending_findings] == ["error", "error"]


def test_state_reader_says_none_for_no_state(tmp_path):
    assert worker_state.read(tmp_path / "missing.state.json") is None
    torn = tmp_path / "torn.state.json"
    torn.write_text('{"case": "test_a')
    assert worker_state.read(torn) is None
    listed = tmp_path / "list.state.json"
    listed.write_text("[1, 2]")
    assert worker_state.read(listed) is None
    os.symlink(listed, tmp_path / "link.state.json")
    assert worker_state.read(tmp_path / "link.state.json") is None


def test_clock_stamps_utc_and_reads_local_stamps():
    stamp = clock.now()
    assert stamp.endswith("+00:00")
    assert abs(clock.parse(stamp) - clock.parse(clock.iso(clock.parse(stamp)))) < 1e-3
    # a stamp an older gpucheck wrote in local time, and a Zulu one, read as the same moment
    assert clock.parse("2026-11-24T03:28:06.266+02:00") == clock.parse("2026-11-24T01:28:06.266Z")
    assert clock.parse("not a time") is None and clock.parse(None) is None


def _state(case: str | None, done: int, pending: list[Finding] | None = None) -> WorkerState:
    return WorkerState(case=case, done=done, total=9, pid=os.getpid(), started=1.5,
                       pending_findings=pending or [])  # fmt: skip


def test_the_worker_rewrites_its_state_in_place_and_skips_the_same_state(tmp_path):
    path = tmp_path / "cpu.plain.state.json"
    writer = worker_state.StateWriter(path)
    big = [Finding("mixed-devices", "error", "x" * 500)]
    writer.write(_state("test_a.py::test_long_name[case]", 1, big))
    inode = path.stat().st_ino
    writer.write(_state(None, 2))  # shorter: spaces over the rest, still one JSON object
    assert worker_state.read(path) == _state(None, 2)
    assert json.loads(path.read_text())["done"] == 2  # plain JSON for any reader
    assert path.stat().st_ino == inode  # the same file: no rename
    writer.write(_state(None, 2))  # nothing new: not written again
    assert writer.count == 2
    writer.write(_state("test_b.py::test_b", 2))
    assert worker_state.read(path) == _state("test_b.py::test_b", 2)
    writer.close()


def test_a_state_much_shorter_than_the_last_one_cuts_the_padding(tmp_path):
    path = tmp_path / "cpu.plain.state.json"
    writer = worker_state.StateWriter(path)
    writer.write(_state("t", 1, [Finding("k", "error", "x" * (worker_state.PAD_LIMIT + 10))]))
    writer.write(_state(None, 1))
    assert path.stat().st_size < 1000
    assert worker_state.read(path) == _state(None, 1)


def test_a_state_read_while_it_was_written_reads_as_none(tmp_path):
    """Half the new state over half the old one: the write numbers at its two ends differ."""
    path = tmp_path / "cpu.plain.state.json"
    writer = worker_state.StateWriter(path)
    writer.write(_state("test_a.py::test_1", 1))
    old = path.read_bytes()
    writer.write(_state("test_a.py::test_2", 2))
    new = path.read_bytes()
    assert len(old) == len(new)
    for cut in range(1, len(new)):
        path.write_bytes(new[:cut] + old[cut:])
        state = worker_state.read(path)
        assert state is None or state in (
            _state("test_a.py::test_1", 1),
            _state("test_a.py::test_2", 2),
        )
    path.write_bytes(new[:40] + old[40:])  # past the first number, before the last
    assert worker_state.read(path) is None


def test_a_sanitizer_workers_limit_names_the_case_that_reached_it(tmp_path):
    path = tmp_path / "cuda0.sanitizer-initcheck.state.json"
    state = WorkerState(
        exit_reason=worker_state.SANITIZER_LIMIT,
        limit_suite="splat",
        limit_case="test_splat.py::test_masked[cuda0]",
    )
    writer = worker_state.StateWriter(path)
    writer.write(state)
    assert worker_state.read(path) == state
    writer.close()
    path.write_text(json.dumps({"exit_reason": "sanitizer-limit", "limit_case": 4}))
    read = worker_state.read(path)
    assert read is not None and read.exit_reason == worker_state.SANITIZER_LIMIT
    assert read.limit_case is None
