"""The runs recorded on GPU machines (``fixtures/``), line by line as written: for the tests
that read each record back and write it again."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: the results files of the recorded runs (each folder's README says where and how)
RUNS = (
    "run_h200_selftest/results.jsonl",
    "run_h200x2_selftest/results.jsonl",
    "run_h200x2_zoo/results.jsonl",
    "run_h200_suites/results.jsonl.gz",
)


def lines(run: str) -> list[dict]:
    """Every record of a recorded results file, as written."""
    path = FIXTURES / run
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def cases(run: str) -> list[dict]:
    """The case records of a recorded results file, as written."""
    return [r for r in lines(run) if r.get("record") == "case"]
