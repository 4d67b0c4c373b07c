"""What the lint session sees: every tracked Python file, whatever its folder is named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ruff_files(*args: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--show-files", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {
        str(Path(line.strip()).resolve().relative_to(ROOT))
        for line in out.splitlines()
        if line.strip().endswith(".py")
    }


def test_ruff_lints_and_formats_every_tracked_python_file() -> None:
    tracked = set(
        subprocess.run(
            ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert "suites/dist/test_render.py" in tracked  # a folder ruff's defaults would skip
    for args in (("check",), ("format",)):
        missed = tracked - _ruff_files(*args)
        assert not missed, f"ruff {args[0]} skips tracked files: {sorted(missed)}"
