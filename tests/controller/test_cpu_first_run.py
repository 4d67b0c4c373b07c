"""The first run without a GPU: ``gpucheck run --cpu-only`` with the default suites tests
something real (the bundled CPU suites, then the distributed suite over gloo), says which of
its suites need a GPU, and its exit code and reports agree."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from clirun import gpucheck

from gpucheck.controller import suites
from gpucheck.model import results


def test_cpu_only_first_run_tests_something_and_names_the_gpu_suites(tmp_path: Path) -> None:
    cwd = tmp_path / "elsewhere"  # no suites/ here: the bundled ones are the defaults
    cwd.mkdir()
    out = tmp_path / "run"
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--out",
        str(out),
        cwd=cwd,
        timeout=600,
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    assert "Traceback" not in said
    assert "knn, splat, ssim test CUDA kernels and need a GPU" in said
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    cases = [r for r in recs if r.get("record") == "case"]
    ran = {(r["suite"], r["mode"]) for r in cases if r["status"] == "passed"}
    assert {("reference", "blocking"), ("checkpoints", "blocking"), ("dist", "dist")} <= ran
    assert not [r for r in cases if r["status"] not in ("passed", "skipped")]
    assert {r["device"] for r in cases if r["mode"] == "dist"} == {"rank0/cpu", "rank1/cpu"}
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["verdict"] == "passed"
    assert "gpucheck passed" in (out / "report.html").read_text()
    assert said.strip().splitlines()[-1].startswith("passed (exit 0)")
    # without a terminal the distributed phase says itself too, a line per rank
    lines = proc.stdout.splitlines()
    assert "dist: the distributed suite (dist) as one gloo group of 2 CPU ranks" in lines
    per_rank = {r["device"]: 0 for r in cases if r["mode"] == "dist"}
    for r in cases:
        if r["mode"] == "dist":
            per_rank[r["device"]] += 1
    for rank, n in per_rank.items():
        assert f"{rank} dist: {n} case(s) recorded" in lines
    # the report compares the ranks with each other, not the cpu pass with a rank
    page = (out / "report.html").read_text()
    section = page.split('<section id="compare">')[1].split("</section>")[0]
    heads = re.findall(r"<th>([^<]*)</th>", section)
    assert heads == ["case", "mode", "rank0/cpu", "rank1/cpu", "spread"]
    compared = re.findall(r"<td title=\"[^\"]*\">([^<]*)</td>", section)
    assert compared and all(
        c.startswith(("test_ddp.py", "test_render.py", "test_dist")) for c in compared
    ), compared


def test_cpu_only_defaults_are_the_suites_that_need_no_gpu(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    gpu, cpu = suites.default(), suites.default(cpu_only=True)
    assert set(cpu) == {"reference", "checkpoints"}  # their suite.toml: needs = "cpu-only"
    assert {"knn", "ssim", "splat"} <= set(gpu) and not set(gpu) & set(cpu)
    assert not {"selftest", "dist", "dist_selftest"} & set(gpu)  # named-only
    assert suites.left_out_without_gpu() == sorted(gpu)


def test_a_users_own_suites_stay_the_default_without_gpu(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "suites" / "mine").mkdir(parents=True)
    (tmp_path / "suites" / "mine" / "test_mine.py").write_text("def test_x():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    assert set(suites.default(cpu_only=True)) == {"mine"} == set(suites.default())
    assert suites.left_out_without_gpu() == []


def test_a_test_file_directly_in_suites_is_a_suite_of_its_own(tmp_path: Path) -> None:
    """A file put straight into ./suites/ (beside a suite folder) runs, named by its stem;
    gpucheck's own suites are not run instead."""
    (tmp_path / "suites" / "mine").mkdir(parents=True)
    (tmp_path / "suites" / "mine" / "test_mine.py").write_text("def test_x():\n    pass\n")
    (tmp_path / "suites" / "test_loose.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "suites" / "helper.py").write_text("def test_no():\n    raise AssertionError\n")
    proc = gpucheck(
        "run", "--cpu-only", "--quiet", "--out", str(tmp_path / "out"), cwd=tmp_path, timeout=180
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (
        "passed (exit 0): 2 case(s): 2 ran (2 passed, 0 failed), 0 skipped"
    )
    ran = {(r["suite"], r["case"]) for r in results.cases(tmp_path / "out" / "results.jsonl")}
    assert ran == {("mine", "test_mine.py::test_x"), ("test_loose", "test_loose.py::test_a")}


def test_in_a_checkout_of_gpucheck_its_suites_folder_is_gpucheck_s_own(
    tmp_path: Path, monkeypatch
) -> None:
    """From a checkout with a wheel built from it installed, ./suites/ is the installed
    package's own suites (their CPU subset under --cpu-only), not a user's."""
    (tmp_path / "gpucheck").mkdir()
    (tmp_path / "gpucheck" / "_resources.py").write_text("")
    shutil.copytree(suites.PROJECT_SUITES / "reference", tmp_path / "suites" / "reference")
    monkeypatch.chdir(tmp_path)
    assert suites.suite_roots() == [suites.PROJECT_SUITES.resolve()]
    assert set(suites.default(cpu_only=True)) == {"reference", "checkpoints"}


def test_in_a_checkout_of_gpucheck_the_workers_run_the_installed_gpucheck_too(
    tmp_path: Path,
) -> None:
    """The gpucheck command imports the installed package (its script does not put the
    current folder on sys.path); its workers, which do (as pytest does), run that one too,
    not the checkout's gpucheck/ beside them."""
    (tmp_path / "gpucheck").mkdir()
    (tmp_path / "gpucheck" / "__init__.py").write_text(
        'raise ImportError("the checkout\'s gpucheck, not the one gpucheck runs")\n'
    )
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "test_mine.py").write_text(
        "import gpucheck.testing\n\ndef test_x():\n    assert gpucheck.check_op\n"
    )
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "test_ranks.py").write_text(
        "import gpucheck.testing\n\ndef test_y(dist_rank):\n    assert gpucheck.check_op\n"
    )
    script = "import sys; sys.path.pop(0); from gpucheck.__main__ import main; main()"
    for how in (["--suite", "mine"], ["--distributed", "--suite", "ranks"]):  # rank: -m pytest
        proc = subprocess.run(
            [sys.executable, "-c", script, "run", "--cpu-only", *how, "--out", f"out-{how[-1]}"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        ran = {r["status"] for r in results.cases(tmp_path / f"out-{how[-1]}" / "results.jsonl")}
        assert ran == {"passed"}, proc.stdout


def test_a_folder_without_tests_does_not_hide_the_suite_of_its_name(
    tmp_path: Path, monkeypatch
) -> None:
    """`python -m build` leaves dist/ in a checkout: `dist` is still the distributed suite."""
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "torch_gpucheck-0.1.0-py3-none-any.whl").write_text("")
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    assert suites.resolve(("dist",)) == {"dist": suites.available()["dist"]}
    assert suites.resolve(("mine",)) == {"mine": (tmp_path / "mine").resolve()}  # no suite


class _StoppedAtOnce:
    """A distributed harness stopped by Ctrl-C before any rank finished a case."""

    def __init__(self, *args, **kwargs) -> None:
        self.notes: list[str] = []

    def run(self) -> None:
        raise KeyboardInterrupt

    def interrupt(self) -> None:
        pass


def test_a_stop_before_the_distributed_suite_ran_does_not_say_it_ran(
    tmp_path: Path, monkeypatch
) -> None:
    from gpucheck.controller import dist_pipeline
    from gpucheck.controller.config import RunConfig
    from gpucheck.model import results
    from gpucheck.model.results import CaseRecord

    monkeypatch.setattr(dist_pipeline, "DistHarness", _StoppedAtOnce)
    path = tmp_path / "results.jsonl"
    results.append(
        path,
        CaseRecord(
            run_id="r", device="cpu", suite="reference", case="t", mode="blocking", status="passed"
        ).to_json(),
    )
    notes: list[str] = []
    assert dist_pipeline.cpu_pass(RunConfig(cpu_only=True), tmp_path, path, "r", notes)
    assert notes == [
        "--cpu-only: the distributed suite (dist) did not run: the run was "
        "stopped before its first case finished"
    ]
    # one dist case recorded before the stop: it ran, until the run was stopped
    results.append(
        path,
        CaseRecord(
            run_id="r",
            device="rank0/cpu",
            suite="dist",
            case="t",
            mode=dist_pipeline.MODE,
            status="passed",
        ).to_json(),
    )
    notes = []
    assert dist_pipeline.cpu_pass(RunConfig(cpu_only=True), tmp_path, path, "r", notes)
    assert notes == [
        f"--cpu-only: the distributed suite (dist) ran as one gloo group of 2 CPU "
        f"ranks (mode {dist_pipeline.MODE}), until the run was stopped"
    ]
