"""Every code example of the docs (docs/*.md, and README.md's besides its shell blocks, which
`nox -s readme` runs) runs here, or, where it needs GPUs or a cluster, is checked as far as a
machine without them allows. Each fenced block is marked on the line before it with how
(``<!-- example: KIND -->``, :data:`KINDS`)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

import click
import jsonschema
import pytest
from clirun import gpucheck
from test_readme import _marked

from gpucheck import cli
from gpucheck.controller.config import project_settings
from gpucheck.model import results

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: how each kind of example is run or checked, and the languages it may be written in
KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "suite": (
        "a test file: run by `gpucheck run --cpu-only` (a check_op battery's dry run; tests "
        "that need a GPU skip) beside stand-ins for the user's extension (STAND_INS)",
        ("python",),
    ),
    "dist-suite": (
        "a distributed test file: run by `gpucheck run --distributed --cpu-only` (gloo)",
        ("python",),
    ),
    "cpu": ("shell for a machine without a GPU: run as written", ("bash",)),
    "readme": ("shell: README's runnable commands (`nox -s readme` runs them)", ("bash",)),
    "commands": (
        "shell or CI steps for GPUs or a cluster: `bash -n`, and every gpucheck command line "
        "parsed by gpucheck's own command line (nothing run)",
        ("bash", "yaml"),
    ),
    "config": ("[tool.gpucheck] of a pyproject.toml: read by gpucheck's reader", ("toml",)),
    "output": (
        "what gpucheck writes or prints: a JSON record is a valid one",
        ("json", "text", ""),
    ),
}
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!-- example: ([\w-]+) -->")
#: the user's extension the examples import, standing in: their ops and functions exist (a
#: battery is built on them, a marker names them); their CUDA kernels do not (never called
#: without a GPU)
STAND_INS = {
    "my_ext.py": """
import torch


@torch.library.custom_op("my_ext::scan", mutates_args=())
def scan(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("my_ext.scan: a CUDA kernel")


@scan.register_fake
def _(x):
    return torch.empty_like(x)


def scan_autograd(x):
    raise RuntimeError("my_ext.scan_autograd: a CUDA kernel")


def fused_loss(x):
    raise RuntimeError("my_ext.fused_loss: a CUDA kernel")
""",
    "my_raster/__init__.py": """
from my_raster import _C


def render(means, colors, bg, width, height):
    raise RuntimeError("my_raster.render: a CUDA kernel")
""",
    "my_raster/_C.py": """
def debug_dump(device_tensor, host_tensor):
    raise RuntimeError("my_raster._C.debug_dump: a CUDA kernel")
""",
}


@dataclass(frozen=True)
class Example:
    doc: Path
    line: int
    lang: str
    kind: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.doc.name}:{self.line}"


def examples(kind: str | None = None) -> list[Example]:
    """Every marked example (README's shell blocks are README's own, marked `readme: ...`)."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for fence in _FENCE.finditer(text):
            lang = fence.group(1)
            if doc.name == "README.md" and lang == "bash":
                continue  # tools/readme_blocks.py: run by `nox -s readme`
            line = text.count("\n", 0, fence.start()) + 1
            before = text[: fence.start()].splitlines()[-1:]
            mark = _MARK.fullmatch(before[0].strip()) if before else None
            assert mark, f"{doc.name}:{line}: a ```{lang} block without <!-- example: KIND -->"
            found.append(Example(doc, line, lang, mark.group(1), fence.group(2)))
    return [e for e in found if kind is None or e.kind == kind]


def test_every_example_says_how_ci_runs_it():
    every = examples()
    assert len(every) >= 20
    for e in every:
        assert e.kind in KINDS, f"{e.name}: unknown kind {e.kind!r}: one of {', '.join(KINDS)}"
        assert e.lang in KINDS[e.kind][1], f"{e.name}: a {e.kind} example in ```{e.lang}"
    for doc in {e.doc for e in every if e.kind in ("commands", "suite", "dist-suite")}:
        if doc.name != "README.md":  # the page says how its examples are checked
            assert "docs_examples" in doc.read_text(), doc.name


def _write_suites(where: Path, chosen: list[Example]) -> list[str]:
    for name, text in STAND_INS.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(text)
    files = []
    for e in chosen:
        file = where / "examples" / f"test_{e.doc.stem}_{e.line}.py"
        file.parent.mkdir(exist_ok=True)
        file.write_text(e.code)
        files.append(str(file.relative_to(where)))
    return files


def _run_suites(tmp_path: Path, kind: str, *options: str) -> None:
    chosen = examples(kind)
    assert chosen
    files = _write_suites(tmp_path, chosen)
    out = tmp_path / "out"
    proc = gpucheck(
        "run",
        *options,
        "--allow-empty",
        *(a for f in files for a in ("--suite", f)),
        "--out",
        str(out),
        cwd=tmp_path,
        timeout=300,
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    recs = list(results.cases(out / "results.jsonl"))
    for e, file in zip(chosen, files, strict=True):
        mine = [r for r in recs if r["suite"] == Path(file).stem]
        assert mine, f"{e.name}: no case recorded"
        bad = [r for r in mine if r["status"] not in ("passed", "skipped")]
        assert not bad, f"{e.name}: {bad}"


def test_suite_examples_run_without_a_gpu_and_pass_what_runs_there(tmp_path):
    """The check_op batteries' dry runs pass (their inputs and references are sound: the
    reference of a float64 battery computes in float64); tests that need a GPU skip, so
    their imports, fixtures and markers are checked."""
    _run_suites(tmp_path, "suite", "--cpu-only")


def test_distributed_suite_examples_run_as_a_gloo_group(tmp_path):
    _run_suites(tmp_path, "dist-suite", "--distributed", "--cpu-only")


def test_cpu_examples_run_as_written(tmp_path):
    for e in examples("cpu"):
        proc = subprocess.run(
            ["bash", "-e", "-c", e.code],
            cwd=tmp_path,
            env={**_env(), "CUDA_VISIBLE_DEVICES": ""},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, f"{e.name}: {proc.stdout[-3000:]}{proc.stderr[-2000:]}"


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def _lines(code: str) -> list[str]:
    """A shell block's commands, comments left out."""
    return [s for s in (re.sub(r"(^|\s+)#.*$", "", c).strip() for c in code.splitlines()) if s]


def test_readme_examples_are_commands_readme_runs():
    runs = {c for b in _marked() for c in b.commands}
    for e in examples("readme"):
        for command in _lines(e.code):
            assert command in runs, f"{e.name}: {command!r} is not one of README's blocks"


#: what ends one command of a shell line
_SEPARATORS = {"&&", "||", ";", "|", "&"}


def gpucheck_commands(code: str) -> list[list[str]]:
    """The arguments of every gpucheck command a shell block (or a CI step's `run:`) runs:
    `gpucheck ...` or `python -m gpucheck[.cli] ...`, in quoted commands (`bash -c '...'`,
    `--wrap "..."`) too. Variables read as 1, command substitutions as `host`."""
    text = re.sub(r"\$\([^)]*\)", "host", code.replace("\\\n", " "))
    text = re.sub(r"\$\{?\w+\}?", "1", text)
    found: list[list[str]] = []
    for line in text.splitlines():
        found += _in(shlex.split(re.sub(r"^\s*-?\s*run:\s*", "", line), comments=True))
    return found


def _in(tokens: list[str]) -> list[list[str]]:
    found: list[list[str]] = []
    for i, token in enumerate(tokens):
        if " " in token:  # a command inside quotes
            found += _in(shlex.split(token, comments=True))
        head = token == "gpucheck" and (i == 0 or tokens[i - 1] in _SEPARATORS)
        module = token in ("gpucheck", "gpucheck.cli") and i > 0 and tokens[i - 1] == "-m"
        if head or module:
            found.append(list(takewhile(lambda t: t not in _SEPARATORS, tokens[i + 1 :])))
    return found


def test_the_command_lines_are_found_where_they_hide():
    code = (
        "srun -N 2 bash -c 'torchrun --nnodes $N \\\n  -m gpucheck.cli run --out $HOME/r'  # x\n"
        'sbatch --wrap "gpucheck merge a/shard-* --out m" && gpucheck devices\n'
        "pip install ray  # gpucheck run --not-this\n"
    )
    assert gpucheck_commands(code) == [
        ["run", "--out", "1/r"],
        ["merge", "a/shard-*", "--out", "m"],
        ["devices"],
    ]


@pytest.fixture
def parse_only(monkeypatch):
    """gpucheck's command line with every command's body replaced by nothing: the options
    and their values are parsed and checked; the files an example assumes (an earlier run's
    folder) need not exist here."""
    for command in cli.cli.commands.values():
        monkeypatch.setattr(command, "callback", lambda *args, **kwargs: 0)
        for param in command.params:
            if isinstance(param.type, click.Path):
                monkeypatch.setattr(param.type, "exists", False)
    return cli.main


def test_command_examples_parse_as_written(parse_only, capsys, tmp_path):
    checked = 0
    for e in examples("commands"):
        if e.lang == "bash":
            syntax = subprocess.run(["bash", "-n"], input=e.code, capture_output=True, text=True)
            assert syntax.returncode == 0, f"{e.name}: {syntax.stderr}"
        commands = gpucheck_commands(e.code)
        assert commands, f"{e.name}: no gpucheck command line"
        for args in commands:
            code = parse_only(args)
            assert code == 0, f"{e.name}: gpucheck {shlex.join(args)}: {capsys.readouterr().err}"
            checked += 1
    assert checked >= 12


def test_config_examples_are_read_as_written(tmp_path):
    for e in examples("config"):
        (tmp_path / "pyproject.toml").write_text(e.code)
        assert project_settings(tmp_path, cli.MODES, cli.FORMATS), e.name


def test_output_examples_are_what_gpucheck_writes():
    """A record shown is a case record of results.jsonl, every field it shows valid (the
    page may leave fields out: the run's id, times, ...)."""
    schema = _optional(results.schema())
    shown = [e for e in examples("output") if e.lang == "json"]
    assert shown
    for e in shown:
        record = json.loads(e.code)
        assert record["record"] == "case", e.name
        jsonschema.validate(record, {**schema["$defs"]["case"], "$defs": schema["$defs"]})


def _optional(schema: object) -> object:
    """``schema`` with no field required (its types and values as they are)."""
    if isinstance(schema, dict):
        return {k: _optional(v) for k, v in schema.items() if k != "required"}
    if isinstance(schema, list):
        return [_optional(v) for v in schema]
    return schema
