"""The README stands alone: no pointers outside the project, links that resolve, and the two
commands it promises (the test command is the one CI runs, as written)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_docs_point_at_nothing_outside_the_project():
    for doc in DOCS:
        text = doc.read_text()
        assert "../shared" not in text and "shared/" not in text, doc
        assert "STORIES.md" not in text and "PEERS.md" not in text, doc


def test_relative_links_resolve():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#]+)\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def _commands(text: str) -> list[str]:
    return [
        line.strip()
        for block in re.findall(r"```bash\n(.*?)```", text, re.S)
        for line in block.splitlines()
        if line.strip()
    ]


def test_ci_runs_the_readme_test_command_as_written():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = "python -m pip install nox && python -m nox -s tests"
    assert test_cmd in _commands(readme)
    assert test_cmd in [line.strip() for line in ci.splitlines()]


def test_the_main_job_command_sets_up_and_runs_every_device():
    main = [
        c
        for c in _commands((ROOT / "README.md").read_text())
        if c.endswith("gpucheck run --all-devices")
    ]
    assert main and "pip install --no-build-isolation -e ." in main[0]


def test_the_usage_page_shows_a_real_finding():
    text = (ROOT / "docs" / "usage.md").read_text()
    section = text.split("### What a finding looks like", 1)[1].split("###", 1)[0]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block, "no record shown"
    import json

    record = json.loads(block.group(1))
    assert record["record"] == "case" and record["findings"]
    assert record["device"].startswith("cuda:")


def test_the_example_report_is_what_a_reader_opens_and_small():
    example = ROOT / "reports" / "example"
    assert sorted(p.name for p in example.iterdir()) == ["README.md", "report.html", "report.png"]
    assert sum(p.stat().st_size for p in example.iterdir()) <= 1_000_000
    page = (example / "report.html").read_text()
    assert "<script src=" not in page and "http://" not in page.split("<body", 1)[1][:2000]
    assert (
        "![" in (ROOT / "README.md").read_text()
        and "reports/example/report.png" in (ROOT / "README.md").read_text()
    )


def test_the_readme_says_what_runs_without_a_gpu():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Without a GPU", 1)[1].split("\n## ", 1)[0]
    assert "gpucheck run --cpu-only" in section
    from gpucheck.controller import suites

    said = [
        n
        for n, p in suites.available().items()
        if suites.declared(p).needs in ("cpu-only", "kernels") or suites.declared(p).distributed
    ]
    assert {"reference", "checkpoints", "dist", "knn", "ssim", "splat"} <= set(said)
    for name in said:
        assert f"`{name}`" in section, name
    assert "[test]" in text or '".[test]"' in text


def _planned_cells() -> list[str]:
    """The 'planned' column of docs/status.md's table."""
    cells = []
    for line in (ROOT / "docs" / "status.md").read_text().splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            parts = [p.strip() for p in line.strip().strip("|").split("|")]
            if len(parts) == 2 and parts[1] and parts[1] != "planned":
                cells.append(parts[1])
    return cells


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 3} - {
        "planned",
        "that",
        "with",
        "what",
        "gpucheck",
        "this",
        "they",
        "them",
        "there",
    }


def test_every_planned_sentence_in_the_docs_is_planned_in_status():
    """docs/status.md is where built and planned are said; a sentence elsewhere that calls
    something planned must be about a row of its 'planned' column (most of its words in one
    cell), not about something built since."""
    cells = [_words(c) for c in _planned_cells()]
    assert cells, "docs/status.md lists nothing as planned"
    for doc in DOCS:
        if doc.name == "status.md":
            continue
        text = re.sub(r"\[[^\]]*\]\([^)]*\)", "", doc.read_text())  # link texts are names
        for sentence in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text)):
            if not re.search(r"\bplanned\b", sentence, re.I):
                continue
            words = _words(sentence)
            best = max(len(words & c) / max(len(words), 1) for c in cells)
            assert best >= 0.6, (
                f"{doc.name}: {sentence!r} calls something planned that "
                "docs/status.md does not list as planned"
            )


def test_the_install_section_installs_what_each_command_needs_first():
    """A fresh venv (pip 23, setuptools 65, no wheel) runs the Install commands as written:
    the first is the CPU-only recipe, torch from PyTorch's CPU index alone (no CUDA wheels,
    and no fallback to PyPI's CUDA build), then the wheel (nothing to build); a build without
    isolation gets setuptools >= 69 and wheel first on its own line (else `invalid command
    'bdist_wheel'`)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Install\n", 1)[1].split("\n## ", 1)[0]
    commands = _commands(section)
    first = [part.strip() for part in commands[0].split("&&")]
    assert first == [
        "python -m pip install torch --index-url https://download.pytorch.org/whl/cpu",
        "python -m pip install gpucheck-0.1.0-py3-none-any.whl",
    ]
    assert "--extra-index-url" not in section
    built = [c for c in commands if "--no-build-isolation" in c]
    assert built
    for command in built:
        before = command.split("--no-build-isolation")[0].split("&&")[0]
        for need in ('"setuptools>=69"', "wheel"):
            assert need in before, (need, command)
    assert "no CUDA" in section
