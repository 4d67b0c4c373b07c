"""A case record's ``numerics`` (gpucheck.model.numerics): every comparison a recorded GPU
run kept reads back and is written again as it was; a comparison someone else wrote is read
without a crash, and never as within tolerance unless it says so."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from gpucheck.model.numerics import Measured

SUITES_RUN = (
    Path(__file__).resolve().parents[1] / "fixtures" / "run_h200_suites" / "results.jsonl.gz"
)


def recorded_comparisons() -> list[dict]:
    with gzip.open(SUITES_RUN, "rt") as f:
        return [m for line in f for m in json.loads(line).get("numerics", [])]


def test_every_recorded_comparison_reads_back_and_writes_again_as_it_was() -> None:
    found = recorded_comparisons()
    assert len(found) > 100
    for written in found:
        m = Measured.from_json(written)
        assert m is not None and m.to_json() == written


def test_a_recorded_comparison_says_how_close_it_came() -> None:
    m = Measured.from_json(recorded_comparisons()[0])
    assert m is not None and m.ok and not m.coverage
    assert m.message().startswith(f"{m.what}: within tolerance (max abs error")


@pytest.mark.parametrize("written", [None, [], "x", {"ok": True}, {"what": 3}])
def test_what_is_not_a_comparison_is_left_out(written: object) -> None:
    assert Measured.from_json(written) is None


def test_a_comparison_someone_else_wrote_reads_without_a_crash() -> None:
    m = Measured.from_json(
        {
            "what": "image",
            "ok": "yes",  # only true is true
            "shape": [4, "x"],
            "dtype": "float32",
            "rtol": "tight",
            "max_abs": None,
            "worst_index": [1, True],
            "got_at_worst": "1.0",
            "mismatched": -3,
            "total": 10,
        }
    )
    assert m is not None and m.what == "image" and m.ok is False
    assert m.shape == [] and m.dtype == "float32" and m.rtol == 0.0 and math.isnan(m.max_abs)
    assert m.worst_index is None and m.got_at_worst is None
    assert (m.mismatched, m.total) == (0, 10)
    assert "image: 0 of 10 elements out of tolerance" in m.message()


def test_an_infinite_error_is_kept() -> None:
    """A NaN where the reference has none is an infinite error (gpucheck.testing.measure)."""
    m = Measured("out", False, [2], "float32", 0, 0, math.inf, math.inf, [1], None, 0.0, 1, 2, 1)
    back = Measured.from_json(json.loads(json.dumps(m.to_json())))
    assert back == m and "1 NaN where the reference has none" in back.message()
