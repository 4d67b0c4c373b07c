"""What the tests of runs spread over jobs or nodes share (shards and merge, Ray): a small
suite written on the fly and the case records of a run folder (they start `gpucheck` with
:mod:`clirun`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from gpucheck.model import results

#: eight cases, one of them failing: what a sharded, merged or Ray run must account for
SUITE = {
    "test_one.py": textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("n", range(4))
        def test_param(n):
            assert n >= 0

        def test_fails():
            assert [1] == [2]
    """),
    "test_two.py": textwrap.dedent("""
        def test_a():
            pass

        def test_b():
            pass

        def test_gpu(gpu_device):
            pass
    """),
}


def make_suite(root: Path, files: dict[str, str] | None = None) -> Path:
    """The suite folder ``root/suites/demo`` holding ``files`` (default :data:`SUITE`)."""
    folder = root / "suites" / "demo"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (files or SUITE).items():
        (folder / name).write_text(text)
    return folder


def cases(out: Path) -> list[dict]:
    """The case records of the run in ``out`` as written."""
    return results.cases(out / "results.jsonl")


def keys(out: Path) -> list[tuple[str, str, str, str]]:
    """(device, suite, case, mode) of every case record of the run in ``out``."""
    return sorted((r["device"], r["suite"], r["case"], r["mode"]) for r in cases(out))
