"""``gpucheck run --shard I/N``: the shards of one plan cover it exactly once, whatever the
order of collection and the device a case runs on; they balance the durations of an earlier
run; a run records its shard; a value that names no shard is refused in one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import NO_GPU, gpucheck
from fleet import keys, make_suite
from hypothesis import given
from hypothesis import strategies as st

from gpucheck import cli
from gpucheck.model.results import CaseRecord
from gpucheck.model.shard import ShardError, ShardPlan, assign, case_key, parse_spec, weights_of

KEYS = st.lists(st.text(min_size=1, max_size=12), max_size=60, unique=True)
WEIGHTS = st.dictionaries(
    st.text(min_size=1, max_size=12), st.floats(min_value=0, max_value=1e4), max_size=40
)


@given(KEYS, st.integers(min_value=1, max_value=9), WEIGHTS, st.randoms())
def test_the_shards_of_a_plan_cover_it_exactly_once(keys_, count, weights, rnd) -> None:
    kept = [ShardPlan(i, count, weights).keep(keys_) for i in range(1, count + 1)]
    assert sum(len(k) for k in kept) == len(keys_)
    assert set().union(*kept) == set(keys_)
    shuffled = list(keys_)
    rnd.shuffle(shuffled)  # another order of collection: the same split
    assert [ShardPlan(i, count, weights).keep(shuffled) for i in range(1, count + 1)] == kept


@given(KEYS, st.integers(min_value=1, max_value=9))
def test_without_durations_the_shards_differ_by_one_case_at_most(keys_, count) -> None:
    sizes = [list(assign(keys_, count, {}).values()).count(i) for i in range(1, count + 1)]
    assert max(sizes) - min(sizes) <= 1


def test_durations_balance_the_shards_where_counting_cases_does_not() -> None:
    weights = {"s::long": 10.0, "s::mid": 6.0, **{f"s::short{i}": 1.0 for i in range(4)}}
    by_time = assign(weights, 2, weights)
    loads = [sum(w for k, w in weights.items() if by_time[k] == s) for s in (1, 2)]
    assert sorted(loads) == [10.0, 10.0]  # 10 | 6+4x1
    by_count = assign(weights, 2, {})
    loads = [sum(w for k, w in weights.items() if by_count[k] == s) for s in (1, 2)]
    assert max(loads) > 10.0
    # a case the earlier run did not hold weighs the mean of those it held
    assert assign(["s::new", "s::long"], 2, {"s::long": 5.0}) == {"s::long": 1, "s::new": 2}


def test_a_case_is_placed_without_its_device() -> None:
    assert case_key("knn", "test_knn.py::test_x[cuda0-fp16]") == case_key(
        "knn", "test_knn.py::test_x[cuda7-fp16]"
    )
    assert case_key("knn", "test_knn.py::test_x[cuda1]") != case_key("ssim", "test_knn.py::x[1]")
    assert case_key("s", "t.py::test_cudaish[cuda12x]") == "s::t.py::test_cudaish[cuda12x]"


def test_durations_per_case_are_the_longest_device_summed_over_modes() -> None:
    def rec(device: str, mode: str, seconds: float, case: str = "t.py::x[cuda0]") -> CaseRecord:
        case = case.replace("cuda0", device.replace(":", ""))
        return CaseRecord("r", device, "s", case, mode, "passed", duration_s=seconds)

    weights = weights_of(
        [
            rec("cuda:0", "blocking", 2.0),
            rec("cuda:1", "blocking", 3.0),
            rec("cuda:0", "sanitizer-memcheck", 7.0),
            rec("cuda:0", "blocking", 9.0, "<worker cuda:0>"),
        ]
    )
    assert weights == {"s::t.py::x[cuda]": 10.0}


@pytest.mark.parametrize("spec", ["0/2", "3/2", "1/0", "2", "a/b", "1/2/3", "-1/2", ""])
def test_a_shard_that_does_not_exist_is_refused(spec: str, capsys) -> None:
    with pytest.raises(ShardError):
        parse_spec(spec)
    assert cli.main(["run", "--cpu-only", "--shard", spec]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--shard'" in err
    assert "I/N" in err and "Traceback" not in err


def test_parse_spec() -> None:
    assert parse_spec("1/1") == (1, 1)
    assert parse_spec(" 3/4 ") == (3, 4)


def test_the_plan_file_round_trips_and_a_foreign_one_is_refused(tmp_path: Path) -> None:
    plan = ShardPlan(2, 3, {"s::a": 1.5}, "/x/results.jsonl")
    plan.write(tmp_path / "shard.json")
    assert ShardPlan.read(tmp_path / "shard.json") == plan
    (tmp_path / "bad.json").write_text(json.dumps({"shard": [4, 3], "weights": {}}))
    for name in ("bad.json", "missing.json"):
        with pytest.raises(ShardError, match="not a shard plan"):
            ShardPlan.read(tmp_path / name)


def test_durations_without_shard_or_without_a_run_are_refused(tmp_path: Path, capsys) -> None:
    assert cli.main(["run", "--cpu-only", "--durations", str(tmp_path)]) == 2
    assert "--durations balances the shards of --shard" in capsys.readouterr().err
    assert cli.main(["run", "--cpu-only", "--shard", "1/2", "--durations", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "expected the run folder of an earlier run or its results.jsonl" in err
    assert not any(tmp_path.iterdir())


def test_sharded_runs_split_a_suite_and_record_their_shard(tmp_path: Path) -> None:
    make_suite(tmp_path)
    run = ("run", "--quiet", "--cpu-only", "--suite", "demo")
    whole = gpucheck(*run, "--out", "all", cwd=tmp_path, env=NO_GPU, timeout=300)
    assert whole.returncode == 1, whole.stdout + whole.stderr  # test_fails
    runs = []
    for i in (1, 2):
        out = f"s{i}"
        shard = ("--shard", f"{i}/2", "--durations", "all")
        proc = gpucheck(*run, "--out", out, *shard, cwd=tmp_path, env=NO_GPU, timeout=300)
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        runs.append(keys(tmp_path / out))
        header = json.loads((tmp_path / out / "results.jsonl").read_text().splitlines()[0])
        assert header["config"]["shard"] == f"{i}/2"
        plan = ShardPlan.read(tmp_path / out / "shard.json")
        assert plan.durations_from == str((tmp_path / "all" / "results.jsonl").resolve())
        assert len(plan.weights) == 8
    assert runs[0] and runs[1]
    assert not set(runs[0]) & set(runs[1])
    assert sorted(runs[0] + runs[1]) == keys(tmp_path / "all")
