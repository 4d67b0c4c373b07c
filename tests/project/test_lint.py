"""What the lint session sees: every tracked Python file, whatever its folder is named."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _tracked() -> set[str]:
    out = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


def test_ruff_lints_every_tracked_python_file() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--show-files", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    seen = {
        str(Path(line.strip()).resolve().relative_to(ROOT))
        for line in out.splitlines()
        if line.strip().endswith(".py")
    }
    tracked = _tracked()
    assert "suites/dist/test_render.py" in tracked  # a folder ruff's defaults would skip
    assert not tracked - seen, f"ruff skips tracked files: {sorted(tracked - seen)}"


def test_ruff_formats_every_tracked_python_file() -> None:
    """The formatter sees what the linter sees, less its own excludes: none a .py file."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    patterns = config.get("format", {}).get("exclude", [])
    excluded = {f for f in _tracked() for p in patterns if fnmatch.fnmatch(f, p)}
    assert not excluded, f"ruff format skips tracked files: {sorted(excluded)}"
