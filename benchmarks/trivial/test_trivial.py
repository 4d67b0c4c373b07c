"""Fifty trivial tests: the fixed cost of a run, where the cases themselves cost nothing
(benchmarks/harness_cost.py --cpu-only)."""

import pytest


@pytest.mark.parametrize("i", range(50))
def test_trivial(i: int) -> None:
    assert i + 1 > i
