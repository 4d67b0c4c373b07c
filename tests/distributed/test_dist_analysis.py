"""gpucheck.distributed.analysis on collective logs as the ranks write them: which rank did not
arrive at which collective, mismatches, crashes, failures, timeouts, and a healthy group."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucheck.distributed.analysis import RankView, diagnose, positions
from gpucheck.distributed.collectives import read
from gpucheck.model.group import EVENTS, CollectiveEntry


def entry(line: dict[str, Any]) -> CollectiveEntry:
    """A log line as the watchdog reads it."""
    read_back = CollectiveEntry.from_json(line)
    assert read_back is not None, line
    return read_back


def enter(
    seq: int,
    op: str = "all_reduce",
    shape: tuple[int, ...] = (4,),
    dev: str = "cpu",
    case: str = "t.py::c",
    where: str = "t.py:10",
    tag: str | None = None,
) -> CollectiveEntry:
    return entry(
        {
            "ev": "enter",
            "seq": seq,
            "op": op,
            "shapes": [list(shape)],
            "dtypes": ["float32"],
            "devices": [dev],
            "case": case,
            "where": where,
            "tag": tag,
        }
    )


def done(seq: int) -> CollectiveEntry:
    return entry({"ev": "done", "seq": seq})


def start(seq: int = 0, case: str = "t.py::c") -> CollectiveEntry:
    return entry({"ev": "case", "case": case, "seq": seq})


def end(
    seq: int, outcome: str = "passed", error: str | None = None, case: str = "t.py::c"
) -> CollectiveEntry:
    return entry({"ev": "case-end", "case": case, "seq": seq, "outcome": outcome, "error": error})


def test_healthy_group_in_flight_is_not_a_problem() -> None:
    # rank 0 already waits in #2, rank 1 has not reached it yet: normal, until the timeout
    views = [
        RankView(0, [start(), enter(1), done(1), enter(2)]),
        RankView(1, [start(), enter(1), done(1)]),
    ]
    assert diagnose(views) is None
    late = diagnose(views, timed_out=True)
    assert late is not None and late.kind == "hang"
    assert late.cause_ranks == [1] and late.waiting_ranks == [0] and late.seq == 2


def test_rank_that_left_the_case_without_a_collective_is_named_at_once() -> None:
    views = [
        RankView(0, [start(), enter(1), done(1), enter(2, where="t.py:12")]),
        RankView(1, [start(), enter(1), done(1)]),
        RankView(2, [start(), enter(1), done(1), end(1)]),
    ]
    d = diagnose(views)
    assert d is not None and d.kind == "hang"
    assert d.cause_ranks == [2] and d.seq == 2 and d.op == "all_reduce"
    assert "rank 2 did not arrive at all_reduce #2" in d.message and "t.py:12" in d.message
    assert "branch on the rank" in (d.hint or "")


def test_shape_mismatch_names_the_odd_rank() -> None:
    views = [RankView(r, [start(), enter(1, shape=(5,) if r == 2 else (4,))]) for r in range(4)]
    d = diagnose(views)
    assert d is not None and d.kind == "collective-mismatch" and d.cause_ranks == [2]
    assert d.waiting_ranks == [0, 1, 3] and "[5]" in d.message and "[4]" in d.message


def test_mismatch_waits_for_the_rank_that_decides_who_is_odd() -> None:
    """Ranks 0 and 2 differ; rank 1 is still on its way: the odd rank is not known yet (the
    3-rank gloo test once named rank 2 with only rank 0 waiting)."""
    first = [
        RankView(0, [start(), enter(1)]),
        RankView(1, [start()]),
        RankView(2, [start(), enter(1, shape=(5,))]),
    ]
    assert diagnose(first) is None
    late = diagnose(first, timed_out=True)
    assert late is not None and late.kind == "collective-mismatch" and late.waiting_ranks == [0]
    first[1].entries.append(enter(1))
    d = diagnose(first)
    assert d is not None and d.kind == "collective-mismatch"
    assert d.cause_ranks == [2] and d.waiting_ranks == [0, 1]
    first[1].entries[-1] = enter(1, shape=(5,))  # rank 1 sides with rank 2: rank 0 is odd
    d = diagnose(first)
    assert d is not None and d.cause_ranks == [0] and d.waiting_ranks == [1, 2]
    gone = [
        RankView(0, [start(), enter(1)]),
        RankView(1, [start()], exit_code=-9),
        RankView(2, [start(), enter(1, shape=(5,))]),
    ]
    d = diagnose(gone)  # a dead rank will not come: judged on the ranks that entered
    assert d is not None and d.kind == "collective-mismatch"


def test_different_ops_at_one_seq_is_a_skipped_collective() -> None:
    views = [
        RankView(0, [start(), enter(1), done(1), enter(2, "all_reduce")]),
        RankView(1, [start(), enter(1), done(1), enter(2, "barrier", shape=())]),
    ]
    d = diagnose(views)
    assert d is not None and d.kind == "collective-mismatch"
    assert "different collectives" in d.message and "barrier #2" in d.message


def test_tensor_on_another_kind_of_device() -> None:
    views = [
        RankView(0, [start(), enter(1, dev="cuda:0")]),
        RankView(1, [start(), enter(1, dev="cpu")]),
    ]
    d = diagnose(views)
    assert d is not None and d.kind == "collective-device"
    # with two ranks either could be odd; the message shows both devices
    assert "cuda:0" in d.message and "cpu" in d.message


def test_refused_tensor_names_the_rank() -> None:
    err = entry(
        {
            "ev": "error",
            "seq": 1,
            "op": "all_reduce",
            "kind": "device",
            "error": "rank 1: all_reduce #1 got a tensor on cpu, but this rank runs on cuda:1",
        }
    )
    views = [
        RankView(0, [start(), enter(1, dev="cuda:0")]),
        RankView(1, [start(), enter(1, dev="cpu"), err]),
    ]
    d = diagnose(views)
    assert d is not None and d.kind == "collective-device" and d.cause_ranks == [1]


def test_crash_names_the_dead_rank_not_the_waiting_ones() -> None:
    views = [
        RankView(0, [start(), enter(1), done(1), enter(2)]),
        RankView(1, [start(), enter(1), done(1)], exit_code=-6),
    ]
    d = diagnose(views)
    assert d is not None and d.kind == "rank-crash" and d.cause_ranks == [1]
    assert "SIGABRT" in d.message and "all_reduce #2" in d.message
    assert "cause" in d.message


def test_exception_on_one_rank_is_a_rank_failure() -> None:
    views = [
        RankView(0, [start(), enter(1), done(1), enter(2)]),
        RankView(1, [start(), enter(1), done(1), end(1, "failed", "ValueError: bad batch")]),
    ]
    d = diagnose(views)
    assert d is not None and d.kind == "rank-failure" and d.cause_ranks == [1]
    assert "ValueError: bad batch" in d.message


def test_timeout_without_any_collective_pending() -> None:
    views = [
        RankView(0, [start(), enter(1), done(1), end(1)]),
        RankView(1, [start(), enter(1), done(1)]),
    ]
    assert diagnose(views) is None
    d = diagnose(views, timed_out=True)
    assert d is not None and d.kind == "hang" and d.cause_ranks == [1]


def test_distributed_render_hang_says_the_mode_is_wrong() -> None:
    tag = "gpucheck.distributed.render(distributed=True) call 4"
    views = [
        RankView(0, [start(), enter(4, "all_gather", tag=tag)]),
        RankView(1, [start(), enter(3, "all_gather", tag=tag), done(3), end(3)]),
    ]
    d = diagnose(views)
    assert d is not None and d.kind == "hang" and d.cause_ranks == [1]
    assert "distributed=False" in (d.hint or "") and "independent scene" in (d.hint or "")


def test_nccl_style_skip_is_found_although_nothing_blocks_in_python() -> None:
    # an NCCL collective returns once queued: rank 0 "finished" all_reduce #2 and the case,
    # rank 1 never issued #2; both wait at the case boundary
    views = [
        RankView(0, [start(), enter(1), done(1), enter(2), done(2), end(2)]),
        RankView(1, [start(), enter(1), done(1), end(1)]),
    ]
    d = diagnose(views)
    assert d is not None and d.kind == "hang" and d.cause_ranks == [1] and d.seq == 2


# ---- the watchdog on bad logs: whatever a rank's log holds, reading and judging it never raises

_OPS = st.sampled_from(["all_reduce", "all_gather", "barrier", "broadcast", "send"])
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 5), st.text(max_size=6), st.floats(allow_nan=True)
)
_FIELD_VALUES = st.one_of(
    _SCALARS,
    st.lists(_SCALARS, max_size=3),
    st.lists(st.lists(st.integers(0, 9), max_size=2), max_size=2),
)
_ENTRIES = st.one_of(
    st.builds(
        enter,
        st.integers(1, 4),
        _OPS,
        st.tuples(st.integers(1, 5)),
        st.sampled_from(["cpu", "cuda:0", "cuda:1"]),
        st.sampled_from(["t.py::c", "t.py::d"]),
    ),
    st.builds(done, st.integers(1, 4)),
    st.builds(start, st.integers(0, 3), st.sampled_from(["t.py::c", "t.py::d"])),
    st.builds(end, st.integers(0, 4), st.sampled_from(["passed", "failed"])),
    st.fixed_dictionaries(
        {"ev": st.sampled_from(["enter", "done", "error", "case", "case-end", "x"])},
        optional={
            k: _FIELD_VALUES
            for k in (
                "seq",
                "op",
                "shapes",
                "dtypes",
                "devices",
                "case",
                "kind",
                "error",
                "where",
                "tag",
                "outcome",
            )
        },
    ),
)


@st.composite
def _log_lines(draw: Any) -> list[str]:
    lines = []
    for drawn in draw(st.lists(_ENTRIES, max_size=8)):
        line = json.dumps(drawn.to_json() if isinstance(drawn, CollectiveEntry) else drawn)
        how = draw(st.sampled_from(["whole", "whole", "whole", "torn", "junk", "json"]))
        if how == "torn":
            line = line[: draw(st.integers(0, len(line)))]
        elif how == "junk":
            line = draw(st.text(max_size=30))
        elif how == "json":
            line = json.dumps(draw(_FIELD_VALUES))
        lines.append(line.replace("\n", " ").replace("\r", " "))
    return lines


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    logs=st.lists(_log_lines(), min_size=1, max_size=4),
    exits=st.lists(st.sampled_from([None, 0, 1, 5, 76, -9, -6, 134]), min_size=4, max_size=4),
    timed_out=st.booleans(),
)
def test_any_log_is_read_and_judged_without_raising(
    tmp_path_factory: Any, logs: list[list[str]], exits: list[int | None], timed_out: bool
) -> None:
    folder = tmp_path_factory.mktemp("logs")
    views = []
    for rank, lines in enumerate(logs):
        path = folder / f"rank{rank}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        entries = read(path)
        assert all(isinstance(e, CollectiveEntry) and e.ev in EVENTS for e in entries)
        views.append(RankView(rank, entries, exits[rank]))
    d = diagnose(views, timed_out=timed_out)
    assert d is None or (
        d.kind in {"hang", "collective-mismatch", "collective-device", "rank-crash", "rank-failure"}
        and set(d.cause_ranks) <= set(range(len(views)))
        and d.message
    )
    assert positions(views).count("\n") == len(views) - 1


def test_read_keeps_the_entries_and_drops_what_is_not_one(tmp_path: Path) -> None:
    good = [start(), enter(1), done(1), enter(2)]
    bad = [
        "7",
        '["ev"]',
        '{"ev": 3}',
        '{"ev": "enter", "op": "all_reduce"}',
        '{"ev": "done", "seq": "2"}',
        '{"ev": "enter", "seq": true}',
        '{"ev": "enter", "seq": 3, "devices": [0]}',
        json.dumps(enter(3).to_json())[:40],
    ]
    path = tmp_path / "rank0.jsonl"
    path.write_text(
        "\n".join(
            [json.dumps(e.to_json()) for e in good[:2]]
            + bad[:4]
            + [json.dumps(e.to_json()) for e in good[2:]]
            + bad[4:]
        )
        + "\n"
    )
    assert read(path) == good
    gap = [RankView(0, [start(), enter(1), done(1)]), RankView(1, [start(), enter(3)])]
    assert diagnose(gap) is None  # rank 1's log lost #2: judged on what it holds
    d = diagnose(gap, timed_out=True)
    assert d is not None and d.kind == "hang" and d.seq == 3
    assert d.cause_ranks == [0] and d.waiting_ranks == [1]
