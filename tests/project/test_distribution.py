"""gpucheck's distribution has a name of its own (``torch-gpucheck``: ``gpucheck`` on the
public package index is an unrelated project), used wherever a distribution is named; where
the other ``gpucheck`` distribution is installed too, the command and the pytest plugin stop
with one sentence that says which to remove."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck import _distribution

ROOT = Path(__file__).resolve().parents[2]
#: the other project's metadata (tests/fixtures/other_gpucheck/README.md)
OTHER = ROOT / "tests" / "fixtures" / "other_gpucheck"


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_distribution_is_named_the_same_everywhere():
    project = _pyproject()["project"]
    assert project["name"] == _distribution.NAME != _distribution.OTHER
    assert project["entry-points"]["pytest11"] == {_distribution.NAME: "gpucheck.pytest_plugin"}
    assert project["description"] == _distribution.SUMMARY
    wheel = _distribution.NAME.replace("-", "_") + f"-{project['version']}-py3-none-any.whl"
    readme = (ROOT / "README.md").read_text()
    assert f"dist/{wheel}" in readme
    assert f"`{_distribution.OTHER}`" in readme and "unrelated" in readme
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        code = "".join(re.findall(r"^```\w*\n(.*?)^```", doc.read_text(), re.S | re.M))
        # from the index, or the old file names: another project's, or no file at all
        other = re.search(r'pip install gpucheck\b|"gpucheck\[|(?<![\w])gpucheck-(0|\*)', code)
        assert other is None, (doc.name, other)


def test_installed_alone_there_is_no_conflict():
    assert _distribution.conflict() is None


@pytest.mark.parametrize(
    ("summary", "said"),
    [
        (None, "the unrelated distribution 'gpucheck' (another project of the same import name"),
        (_distribution.SUMMARY, "this environment holds an older install of gpucheck under"),
    ],
)
def test_beside_another_gpucheck_distribution_one_sentence_says_which_to_remove(
    tmp_path, monkeypatch, summary, said
):
    other = OTHER
    if summary is not None:  # this project's own, installed under the old name
        info = tmp_path / "gpucheck-0.1.0.dist-info"
        info.mkdir()
        info.joinpath("METADATA").write_text(
            f"Metadata-Version: 2.1\nName: gpucheck\nVersion: 0.1.0\nSummary: {summary}\n"
        )
        other = tmp_path
    monkeypatch.syspath_prepend(str(other))
    problem = _distribution.conflict()
    assert problem is not None and problem.startswith(said)
    assert "`python -m pip uninstall gpucheck`" in problem and _distribution.NAME in problem
    assert "\n" not in problem and problem.count(". ") == 0  # one sentence


def test_the_command_and_the_pytest_plugin_stop_with_that_sentence(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(OTHER)}
    said = "gpucheck: the unrelated distribution 'gpucheck'"
    command = subprocess.run(
        [sys.executable, "-m", "gpucheck", "run", "--cpu-only"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert command.returncode == 2
    assert command.stderr.strip().splitlines() == [_said(command.stderr, said)]
    assert command.stdout == "" and not list(tmp_path.iterdir())  # nothing run, nothing made
    (tmp_path / "test_a.py").write_text("def test_a():\n    pass\n")
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_a.py"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert plain.returncode == pytest.ExitCode.USAGE_ERROR
    assert f"ERROR: {said}" in plain.stderr and "Traceback" not in plain.stderr
    assert "1 passed" not in plain.stdout


def _said(stderr: str, start: str) -> str:
    line = stderr.strip().splitlines()[0]
    assert line.startswith(start), stderr
    return line
