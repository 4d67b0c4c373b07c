"""tools/gpu, the GPU verification driver: its step list, its shell, and the parts that need no
GPU (the tables it prints from run folders), run here on a recorded 2-GPU self-test run; and the
paths the docs name for benchmarks, recorders and steps."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tools" / "gpu"
STEPS = ROOT / "tools" / "gpu_steps"
RECORDED = ROOT / "tests" / "fixtures" / "run_h200x2_selftest"
PROBES = ROOT / "tools" / "probes"
#: the maps of tools/ and benchmarks/
INDEXES = (ROOT / "tools" / "README.md", PROBES / "README.md", ROOT / "benchmarks" / "README.md")

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RUN", "WHEELS", "OUT", "WORK")}
    path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return {
        **env,
        "PYTHONPATH": path,
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        **extra,
    }


KINDS = ("verify", "measure", "record")


def _listed() -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """`tools/gpu --list` read back: each kind's (step, summary) rows, and the release list."""
    out = subprocess.run(
        ["bash", str(GPU), "--list"], capture_output=True, text=True, check=True
    ).stdout
    groups: dict[str, list[tuple[str, str]]] = {}
    release: list[str] = []
    group = ""
    for line in out.splitlines():
        if not line.startswith(" "):
            group = line.split(":")[0]
            groups.setdefault(group, [])
        elif group == "release":
            release += line.split()
        else:
            name, _, summary = line.strip().partition(" ")
            groups[group].append((name, summary.strip()))
    groups.pop("release", None)
    return groups, release


@needs_bash
def test_list_shows_each_step_under_its_kind_with_one_line():
    groups, _ = _listed()
    assert tuple(groups) == KINDS
    for kind, rows in groups.items():
        files = sorted(p.stem for p in (STEPS / kind).glob("*.sh") if not p.name.startswith("_"))
        assert sorted(name for name, _ in rows) == files, kind
        for name, summary in rows:
            assert len(summary) > 20, f"step {name} has no one-line summary"
    names = [name for rows in groups.values() for name, _ in rows]
    assert len(names) == len(set(names))
    # every step file lives in a kind's folder; the folder itself holds helpers only
    assert not list(STEPS.glob("*.sh"))


@needs_bash
def test_step_names_the_gpu_machines_call_are_kept():
    groups, _ = _listed()
    names = {name for rows in groups.values() for name, _ in rows}
    assert names >= {"install", "selftest", "resume", "matrix", "suites", "cost", "dist"}
    assert {name for name, _ in groups["measure"]} >= {"bench-ssim", "bench-knn", "tolerances"}
    assert [name for name, _ in groups["record"]] == ["record"]


@needs_bash
def test_release_runs_every_verify_step_install_first_installed_last():
    groups, release = _listed()
    assert release == [name for name, _ in groups["verify"]]
    assert release[0] == "install" and release[-1] == "installed"
    assert release.index("selftest") < release.index("resume") < release.index("matrix")


def test_the_driver_sets_no_setting_a_step_reads():
    """Steps run in a subshell of tools/gpu: a name the driver assigns would hide the
    setting of that name (`RECORD=oom tools/gpu record`) from the step that reads it."""
    driver = set(re.findall(r"^([A-Za-z_]\w*)=", GPU.read_text(), re.M))
    shared = {"OUT", "WORK", "PY", "ROOT", "STEP_TIMEOUT", "NGPU", "ALL"}  # documented inputs
    for step in STEPS.glob("*/*.sh"):
        read = set(re.findall(r"\$\{([A-Za-z_]\w*):?-", step.read_text()))
        assert not (read & driver) - shared, step.name


@needs_bash
@pytest.mark.parametrize("first", ["install", "release", "verify"])
def test_unknown_step_is_refused_before_anything_runs(tmp_path, first):
    """A kind's name is no step (only `release` names a list); nothing starts."""
    args = [first, "nosuch"]
    proc = subprocess.run(
        ["bash", str(GPU), *args], capture_output=True, text=True, env=_env(tmp_path)
    )
    assert proc.returncode == 2
    bad = "verify" if first == "verify" else "nosuch"
    assert f"no step '{bad}'" in proc.stderr
    assert not (tmp_path / "out").exists()  # install did not start


@needs_bash
@pytest.mark.parametrize(
    "script",
    sorted([GPU, *STEPS.glob("*/*.sh"), *(ROOT / "benchmarks").glob("*.sh")], key=str),
    ids=lambda p: p.name,
)
def test_shell_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@needs_bash
def test_matrix_step_on_a_recorded_two_gpu_run(tmp_path):
    """The matrix step needs no GPU: on the recorded run it prints the defect x detector rows,
    archives its folder to $OUT as it ends, and prints the table of steps last."""
    proc = subprocess.run(
        ["bash", str(GPU), "matrix"],
        capture_output=True,
        text=True,
        env=_env(tmp_path, RUN=str(RECORDED)),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the run of 2026-11-24 (first 2-GPU self-test): 9 found, the 3 guard rows missed, the
    # rows added since then not run; no false positive
    summary = "rows 26: 9 found, 3 missed, 14 not run; false positives on clean cases: 0"
    assert summary in proc.stdout
    last = proc.stdout.strip().splitlines()[-1].split()
    assert last[:2] == ["matrix", "0"]
    assert summary in (tmp_path / "out" / "summary.txt").read_text()
    with tarfile.open(tmp_path / "out" / "matrix.tgz") as tar:
        names = tar.getnames()
    assert "matrix/table.txt" in names and "matrix/step.log" in names


@needs_bash
def test_matrix_step_without_a_run_folder_fails_and_says_so(tmp_path):
    proc = subprocess.run(
        ["bash", str(GPU), "matrix"],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=120,
    )
    assert proc.returncode == 0  # the driver ran; the step's failure is in its row
    row = proc.stdout.strip().splitlines()[-1]
    assert row.split()[:2] == ["matrix", "1"] and "no results.jsonl" in row


def _run(folder: Path, cases: dict[str, tuple[str, float]], cost: dict | None = None) -> None:
    folder.mkdir(parents=True)
    lines = [
        json.dumps(
            {
                "record": "case",
                "case": c,
                "suite": s,
                "device": "cuda:0",
                "mode": "blocking+nvml",
                "status": "passed",
                "duration_s": d,
                "findings": [],
                "cost_s": cost or {},
            }
        )
        for c, (s, d) in cases.items()
    ]
    (folder / "results.jsonl").write_text("\n".join(lines) + '\n{"torn')


def test_cost_table_pairs_each_setting_on_both_cards(tmp_path):
    off = {"a": ("knn", 1.0), "b": ("ssim", 2.0), "only_off": ("knn", 9.0)}
    on = {"a": ("knn", 1.5), "b": ("ssim", 2.0)}
    for lab, cases in (("on_a", on), ("off_a", off), ("on_b", on), ("off_b", off)):
        spent = {"unwritten-output": 0.25, "memory-layout": 0.5} if lab == "on_a" else None
        _run(tmp_path / f"cost_{lab}", cases, spent)
    proc = subprocess.run(
        [sys.executable, str(STEPS / "tables.py"), "cost", str(tmp_path)],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert "cost: 2 cases passed in all four runs" in proc.stdout
    # (1.5 + 2.0) / (1.0 + 2.0) over both pairs; per case 1.5 and 1.0
    *_, ratio, spent = proc.stdout.strip().splitlines()
    assert ratio == "detectors on / off: 1.167 (sum of case time of 2 cases), per-case median 1.250"
    # each detector's seconds over the two runs with detectors on, their mean (one run here)
    assert spent == (
        "cost_s of the detectors on (mean of the two runs): memory-layout 0.50 s, "
        "unwritten-output 0.25 s"
    )
    assert re.search(r"knn +1 cases +on +1\.50 s +off +1\.00 s +ratio 1\.500", proc.stdout)


def test_counts_table_of_the_recorded_run():
    proc = subprocess.run(
        [sys.executable, str(STEPS / "tables.py"), "counts", str(RECORDED)],
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith("run_h200x2_selftest: 86 case records")


# every path to a script or results file that the docs, the fixture READMEs and the history's
# table of moved scripts name (HISTORY.md's own log keeps the old names, as recorded)
_PATH = re.compile(r"(?<![\w/.])((?:benchmarks|tools|tests/fixtures)/[\w./-]+\.(?:py|sh|md))")


def _named_paths() -> set[str]:
    docs = [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "tests" / "fixtures").glob("*/README.md"),
        ROOT / "benchmarks" / "RESULTS.md",
        *INDEXES,
        ROOT / "tools" / "gpu",
        *STEPS.glob("*/*.sh"),
        *(ROOT / "benchmarks").glob("*.py"),
    ]
    return {m for p in docs for m in _PATH.findall(p.read_text())}


def test_paths_named_in_docs_exist_or_are_old_names_history_maps():
    named = _named_paths()
    assert "tests/fixtures/launches/record_launch_traces.py" in named
    history = (ROOT / "benchmarks" / "HISTORY.md").read_text()
    moved = set(_PATH.findall(history[: history.index("# Recorded GPU results")]))
    assert "benchmarks/gpu_matrix.sh" in moved
    missing = sorted(p for p in named - moved if not (ROOT / p).exists())
    assert not missing
    assert not [p for p in moved if p.startswith("benchmarks/gpu_") and (ROOT / p).exists()]


def test_recorders_live_beside_their_fixtures():
    for fixture, script in (
        ("launches", "record_launch_traces.py"),
        ("launches", "record_pybind_traces.py"),
        ("oom", "record_oom_messages.py"),
    ):
        folder = ROOT / "tests" / "fixtures" / fixture
        assert (folder / script).is_file()
        assert f"tests/fixtures/{fixture}/{script}" in (folder / "README.md").read_text()
        assert script in (STEPS / "record" / "record.sh").read_text()


def test_results_links_reach_sections_of_the_history():
    """RESULTS.md cites the HISTORY.md section of every number: each link's anchor must be a
    heading there (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens)."""
    history = (ROOT / "benchmarks" / "HISTORY.md").read_text()
    anchors = {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in history.splitlines()
        if line.startswith("#")
    }
    links = re.findall(r"\(HISTORY\.md#([^)]+)\)", (ROOT / "benchmarks" / "RESULTS.md").read_text())
    assert len(links) >= 8
    assert not sorted(set(links) - anchors)


def _table_rows(readme: Path) -> dict[str, str]:
    """A README's table rows by their first cell (a file name in backquotes)."""
    rows = re.findall(r"^\| `([^`]+)` \|(.*)$", readme.read_text(), re.M)
    return dict(rows)


def test_benchmarks_readme_has_a_line_per_benchmark_with_how_and_where():
    rows = _table_rows(ROOT / "benchmarks" / "README.md")
    scripts = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh"))
    assert sorted(rows) == scripts
    for name, row in rows.items():
        assert "RESULTS.md" in row or "HISTORY.md" in row, f"{name}: where its numbers go"
        assert f"benchmarks/{name}" in row or "tools/gpu " in row, f"{name}: how to run it"


def test_every_bench_step_runs_a_benchmark_the_readme_lists():
    rows = _table_rows(ROOT / "benchmarks" / "README.md")
    for step in (STEPS / "measure").glob("bench-*.sh"):
        assert f"tools/gpu {step.stem}" in "".join(rows.values()), step.name


def test_probes_are_each_documented_with_what_they_found():
    rows = _table_rows(PROBES / "README.md")
    assert sorted(rows) == sorted(p.name for p in PROBES.glob("*.py"))
    history = (ROOT / "benchmarks" / "HISTORY.md").read_text()
    for name, row in rows.items():
        assert f"tools/probes/{name}" in row
        section = re.findall(r'"([^"]+)"', row)[-1]  # the HISTORY.md section it cites
        assert f"# {section}" in history, f"{name}: no section {section!r} in HISTORY.md"


@pytest.mark.parametrize("probe", sorted(PROBES.glob("*.py")), ids=lambda p: p.name)
def test_probe_starts_on_cpu(probe, tmp_path):
    """A probe runs on a GPU, by hand: here its imports (the suites' helpers, gpucheck.ops)
    and arguments, so a change that breaks it shows without one."""
    proc = subprocess.run(
        [sys.executable, str(probe), "--help"],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


@pytest.mark.parametrize("readme", INDEXES, ids=lambda p: str(p.relative_to(ROOT)))
def test_index_links_resolve(readme):
    for target in re.findall(r"\]\(([^)#]+)\)", readme.read_text()):
        assert (readme.parent / target).exists(), f"{readme} links to missing {target}"
