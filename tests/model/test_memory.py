"""A case record's ``memory`` (gpucheck.model.memory): read back and written again as the
worker wrote it on GPU runs, what it says (a case's own peak, the pool, other GPUs), and
fields someone else wrote read as unknown, never as 0 or a crash."""

from __future__ import annotations

import json

import pytest
from recordkit import RUNS
from recordkit import cases as recorded_cases

from gpucheck.model.memory import Memory


@pytest.mark.parametrize("run", RUNS)
def test_every_recorded_memory_reads_back_and_writes_again_as_it_was(run: str) -> None:
    """Every peak measured is written back as it was; an unknown one (``null`` in the
    records of these runs) is left out, and reads back unknown again."""
    cases = recorded_cases(run)
    assert cases
    for r in cases:
        memory = Memory.from_json(r["memory"])
        written = memory.to_json()
        assert written == {k: v for k, v in r["memory"].items() if v is not None}, r["case"]
        assert Memory.from_json(json.loads(json.dumps(written))) == memory


def test_a_recorded_gpu_case_says_its_peaks() -> None:
    """A case of the suites' run on an H200: its own peak above what it started with, the
    memory outside PyTorch's pool, no other GPU touched."""
    r = next(
        r
        for r in recorded_cases(RUNS[3])
        if r["status"] == "passed"
        and r["memory"]["torch_allocated_at_start"] is not None
        and r["memory"]["torch_peak_allocated"] > r["memory"]["torch_allocated_at_start"]
    )
    m = Memory.from_json(r["memory"])
    raw = r["memory"]
    assert m.torch_peak_allocated == raw["torch_peak_allocated"] > 0
    assert m.own_peak == raw["torch_peak_allocated"] - raw["torch_allocated_at_start"] > 0
    assert m.outside_pool == max(0, raw["nvml_peak_used"] - raw["torch_peak_reserved"])
    assert m.other_devices == {u: b for u, b in raw["nvml_peak_other_devices"].items() if b}


def test_what_was_not_measured_is_unknown_not_zero() -> None:
    none = Memory()
    assert none.to_json() == {}  # a record the controller wrote for a crash: nothing said
    assert (none.own_peak, none.outside_pool, none.other_devices) == (None, None, {})
    no_pool = Memory(nvml_peak_used=600)
    assert no_pool.outside_pool == 600  # the NVML peak itself where the pool is unknown
    below = Memory(torch_peak_allocated=100, torch_allocated_at_start=100)
    assert below.own_peak is None  # nothing above what the case started with
    assert Memory(nvml_peak_used=5, torch_peak_reserved=9).outside_pool == 0  # sampled late


@pytest.mark.parametrize(
    "written",
    [
        None,
        [],
        "memory",
        {"torch_peak_allocated": "300"},
        {"torch_peak_allocated": -1},
        {"torch_peak_allocated": True},
        {"torch_peak_allocated": 1.5},
        {"nvml_peak_other_devices": []},
    ],
)
def test_a_field_that_is_not_a_byte_count_reads_as_unknown(written: object) -> None:
    assert Memory.from_json(written) == Memory()


def test_other_devices_keep_only_byte_counts() -> None:
    m = Memory.from_json({"nvml_peak_other_devices": {"GPU-a": 5, "GPU-b": "x", "GPU-c": 0}})
    assert m.nvml_peak_other_devices == {"GPU-a": 5, "GPU-c": 0}  # as read (written again)
    assert m.other_devices == {"GPU-a": 5}  # held memory there
