"""The README stands alone: no pointers outside the project, links that resolve, and the two
commands it promises (the test command is the one CI runs, as written)."""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

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


@functools.cache
def _blocks() -> ModuleType:
    """tools/readme_blocks.py (loaded by path, as the noxfile and tools/gpu load it)."""
    spec = importlib.util.spec_from_file_location("readme_blocks", ROOT / "tools/readme_blocks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _marked(kind: str | None = None) -> list:
    every = _blocks().blocks((ROOT / "README.md").read_text())
    return [b for b in every if kind is None or b.kind == kind]


def test_ci_runs_the_readme_test_command_as_written():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    test_cmd = "python -m pip install nox && python -m nox -s tests"
    assert [b.commands for b in _marked("ci")] == [[test_cmd]]
    assert test_cmd in ci and "python -m nox -s readme" in ci


def test_every_shell_block_of_the_readme_says_what_runs_it(tmp_path):
    text = (ROOT / "README.md").read_text()
    assert len(_marked()) == text.count("```bash\n") >= 6
    assert {b.kind for b in _marked()} == {"cpu", "gpu", "ci"}
    unmarked = "# x\n\nSome text:\n\n```bash\ngpucheck run\n```\n"
    with pytest.raises(ValueError, match=r"README\.md:5: a bash block without a"):
        _blocks().blocks(unmarked)
    with pytest.raises(ValueError, match="unknown kind 'gpus'"):
        _blocks().blocks("<!-- readme: gpus -->\n```bash\nls\n```\n")


def _install(kind: str) -> list[str]:
    """The commands of the Install section's block of ``kind`` (its first)."""
    section = (ROOT / "README.md").read_text().split("## Install\n", 1)[1].split("\n## ", 1)[0]
    return next(b.commands for b in _blocks().blocks(section) if b.kind == kind)


def test_the_main_job_and_the_run_without_a_gpu_are_the_install_then_the_run():
    """Each runs as written in a fresh clone: the install of its kind, then its run; the
    install blocks run as their first lines (covered), once."""
    main = [b for b in _marked("gpu") if b.commands[-1] == "gpucheck run --all-devices"]
    assert len(main) == 1 and main[0].commands == [*_install("gpu"), "gpucheck run --all-devices"]
    cpu = [b for b in _marked("cpu") if b.commands[-1] == "gpucheck run --cpu-only"]
    assert len(cpu) == 1 and cpu[0].commands == [*_install("cpu"), "gpucheck run --cpu-only"]
    every = _marked()
    for install in (b for b in every if b.commands in (_install("cpu"), _install("gpu"))):
        assert _blocks().covered(install, every) in (main[0], cpu[0])
    run = [b.line for k in ("cpu", "gpu") for b in _blocks().to_run(k)]
    assert main[0].line in run and cpu[0].line in run and len(run) == len(set(run))


#: what a README line may run with ``python -m``, and the package that must be installed
#: before it in the same block
TOOLS = {"build": "build", "nox": "nox", "pip": None}


def test_each_block_installs_what_it_runs_and_builds_what_it_installs():
    """No file that does not exist in a fresh clone, no tool the block does not install:
    a file of dist/ is built earlier in the block (the wheel with --wheel, the sdist with
    --sdist), a `python -m TOOL` follows a pip install of it, `gpucheck` follows an install
    of gpucheck; a build without isolation has setuptools >= 69 and wheel installed first."""
    for block in _marked():
        done: list[str] = []
        for part in (p.strip() for c in block.commands for p in c.split("&&")):
            where = f"README.md:{block.line}: {part}"
            for tool in re.findall(r"python -m (\w+)", part):
                assert tool in TOOLS, where
                assert TOOLS[tool] is None or any(
                    d.startswith("python -m pip install") and f" {TOOLS[tool]}" in d for d in done
                ), where
            for made in re.findall(r"dist/\S+", part):
                kind = "--wheel" if made.endswith(".whl") else "--sdist"
                assert any(d.startswith("python -m build") and kind in d for d in done), where
            if part.startswith("gpucheck "):
                assert any("install dist/" in d or "install --no-build-isolation" in d
                           for d in done), where  # fmt: skip
            if "--no-build-isolation" in part:
                assert any('"setuptools>=69"' in d and " wheel" in d for d in done), where
            done.append(part)


def test_the_cpu_blocks_never_resolve_a_cuda_torch():
    """Without a GPU, torch comes from PyTorch's CPU index alone (no fallback to PyPI's CUDA
    build); a bare `torch` only in the blocks for GPU machines."""
    for block in _marked("cpu"):
        for part in (p.strip() for c in block.commands for p in c.split("&&")):
            if part.startswith("python -m pip install") and " torch" in f" {part} ":
                assert part.endswith("--index-url https://download.pytorch.org/whl/cpu"), part
    assert "--extra-index-url" not in (ROOT / "README.md").read_text()


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


def test_the_install_section_says_where_the_wheel_lands_and_what_the_other_gpucheck_is():
    section = (ROOT / "README.md").read_text().split("## Install\n", 1)[1].split("\n## ", 1)[0]
    text = re.sub(r"\s+", " ", section)
    assert "into `dist/`" in text and "no CUDA" in text
    assert "the `gpucheck` distribution on the public package index is an unrelated project" in text
    assert "--system-site-packages" in text  # how a GPU user keeps the CUDA torch they have


#: a measured number as the docs quote one: a share, a ratio, a time of milliseconds or
#: microseconds (``~`` and a sign are how it is quoted, not part of it; 16×16 is a size)
_MEASURED = re.compile(r"(?<![\w.])[~+]?(\d+(?:\.\d+)?)\s?(%|×(?!\s?\d)|x\b|ms\b|µs\b)")
#: numbers of those units in the docs that are settings, not measurements: (page, as written)
_SETTINGS = {("check_op.md", "10 ms")}  # the NVML sampling interval's default


def _quoted(text: str) -> list[str]:
    """The measured numbers a page quotes in its prose (code blocks are examples)."""
    prose = re.sub(r"^```.*?^```|<!--.*?-->", "", text, flags=re.S | re.M)
    found = []
    for m in _MEASURED.finditer(prose):
        if m.group(2) == "×" and re.match(r"\s?(H100|H200|GPU)", prose[m.end() :]):
            continue  # a machine: 2× H200
        found.append(f"{m.group(1)}{'' if m.group(2) in 'x×' else ' '}{m.group(2)}")
    return found


def test_every_measured_number_the_docs_quote_is_in_the_results():
    """README and docs/ quote measurements only as benchmarks/RESULTS.md has them (the
    newest of each): a number measured again there cannot go stale here; docs/status.md
    quotes none."""
    results = re.sub(r"\s+", " ", (ROOT / "benchmarks" / "RESULTS.md").read_text())
    quoted = {(doc.name, q) for doc in DOCS for q in _quoted(doc.read_text())}
    assert len(quoted) >= 4 and not {q for d, q in quoted if d == "status.md"}
    for doc, number in sorted(quoted - _SETTINGS):
        value, _, unit = number.partition(" ") if " " in number else (number[:-1], "", number[-1])
        found = re.search(rf"(?<![\d.]){re.escape(value)}\s?{re.escape(unit)}", results)
        assert found, f"{doc} quotes {number}, which benchmarks/RESULTS.md does not hold"


def test_the_results_keep_one_row_a_measurement():
    """RESULTS.md's other numbers are the newest of each: one row per thing measured on one
    kind of machine, and none that says something is not yet what it has become since."""
    section = (ROOT / "benchmarks" / "RESULTS.md").read_text().split("## Other recorded numbers")[1]
    rows = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| ")]
    assert len(rows) == len(set(rows)), [r for r in rows if rows.count(r) > 1]
    assert "not yet the default" not in section
    verdict = [r for r in rows if r.startswith("| time to verdict") and "kernel suites" in r]
    assert len(verdict) <= 3  # one H200, one H100, two GPUs
