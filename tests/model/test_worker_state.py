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
    worker_state.write(path, state)
    assert worker_state.read(path) == state
    assert not list(tmp_path.glob("*.tmp"))  # replaced in one step


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
