"""The run header's settings (gpucheck.model.settings): what recorded GPU runs wrote reads
back and is written again, and settings of types gpucheck never writes are named, one
sentence each, in the order ``--resume`` refuses them."""

from __future__ import annotations

import json

import pytest
from recordkit import RUNS, lines

from gpucheck.model.settings import RunSettings


def recorded_config(run: str) -> dict:
    return lines(run)[0]["config"]


@pytest.mark.parametrize("run", RUNS)
def test_recorded_settings_read_back_and_are_written_again(run: str) -> None:
    """Every setting recorded is written again as it was (one a later gpucheck records is
    added with its default)."""
    written = recorded_config(run)
    settings = RunSettings.from_json(written)
    assert settings.recorded and settings.problems == []
    again = settings.to_json()
    assert {k: again[k] for k in written} == written
    defaults = RunSettings().to_json()
    assert {k: v for k, v in again.items() if k not in written} == {
        k: v for k, v in defaults.items() if k not in written
    }
    assert RunSettings.from_json(json.loads(json.dumps(again))) == settings


def test_a_recorded_run_says_its_settings() -> None:
    s = RunSettings.from_json(recorded_config(RUNS[2]))
    assert s.all_devices and s.suites and s.suite_paths and s.timeout and s.timeout > 0
    assert s.shard is None and s.shard_of is None and s.merged_from == []
    assert RunSettings(shard="2/3").shard_of == (2, 3)


@pytest.mark.parametrize("written", [None, {}, [], "config"])
def test_a_header_without_settings_is_not_recorded(written: object) -> None:
    s = RunSettings.from_json(written)
    assert not s.recorded and s.problems == []


def test_settings_of_other_types_are_named_in_order_and_read_as_defaults() -> None:
    s = RunSettings.from_json(
        {
            "suite_paths": {"a": 1},
            "pytest_args": "-p evil",
            "timeout": "never",
            "cpu_only": "yes",
            "world_size": True,
            "devices": [0, "1"],
            "ray": 7,  # nothing runs from it: not recorded, no refusal
        }
    )
    assert s.problems == [
        "its recorded setting 'cpu_only' is 'yes'",
        "its recorded setting 'timeout' is 'never'",
        "its recorded setting 'world_size' is True",
        "its recorded setting 'devices' is [0, '1']",
        "its recorded setting 'pytest_args' is '-p evil'",
        "its recorded suite paths are {'a': 1}",
    ]
    assert (s.cpu_only, s.timeout, s.world_size, s.devices, s.pytest_args) == (
        False,
        None,
        None,
        [],
        [],
    )
    assert s.suite_paths == {} and s.ray is None


def test_a_merged_runs_settings_name_its_folders() -> None:
    merged = RunSettings(suites=["knn"], merged_from=["/runs/s1", "/runs/s2"])
    line = merged.to_json()
    assert line["merged_from"] == ["/runs/s1", "/runs/s2"]
    assert "merged_from" not in RunSettings().to_json()
    assert RunSettings.from_json(line) == merged
