"""What `gpucheck run` writes can be trusted: one run per folder (and `--resume` to continue
one), an unbuilt extension said once, a run that tested nothing is not a pass, and case ids
that do not depend on where pytest put its rootdir."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
import types
from collections import Counter
from datetime import datetime
from pathlib import Path

import jsonschema
import pytest
import torch  # noqa: F401  (before pytester's in-process runs: torch cannot be imported twice)
from clirun import gpucheck, start
from demosuite import start_until_stuck

from gpucheck import cli
from gpucheck.controller import config
from gpucheck.controller.suites import PROJECT_SUITES, declared
from gpucheck.model import clock, results

SUITE = textwrap.dedent("""
    import os, time, pytest

    def test_a():
        assert 1 + 1 == 2

    def test_b():
        assert [1] == [2]

    def test_hang():
        if os.environ.get("DEMO_HANG"):
            time.sleep(600)

    def test_c():
        pass

    def test_d(gpu_device):
        pass
""")


@pytest.fixture
def project(tmp_path):
    suite = tmp_path / "suites" / "demo"
    suite.mkdir(parents=True)
    (suite / "test_mix.py").write_text(SUITE)
    return tmp_path


def gpucheck_run(cwd, *args, env=None, timeout=180):
    return gpucheck("run", "--quiet", *args, cwd=cwd, timeout=timeout, env=env)


def records(out: Path) -> list[dict]:
    return list(results.read(out / "results.jsonl"))


def test_a_second_run_into_the_same_folder_is_refused_and_leaves_the_first_intact(project):
    out = project / "out"
    first = gpucheck_run(project, "--cpu-only", "--out", str(out))
    assert first.returncode == 1, first.stdout + first.stderr  # test_b fails
    for name in ("report.html", "results.json", "junit.xml"):  # every report, at the end
        assert (out / name).stat().st_size > 0, name
    before = (out / "results.jsonl").read_bytes()
    second = gpucheck_run(project, "--cpu-only", "--out", str(out))
    assert second.returncode == 2
    assert "Traceback" not in second.stderr
    assert "already holds a gpucheck run" in second.stderr
    assert "--resume" not in second.stderr  # it finished: only what works is suggested
    assert (out / "results.jsonl").read_bytes() == before  # nothing appended


def test_a_folder_holding_other_files_is_refused_too(project, capsys):
    out = project / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert cli.main(["run", "--cpu-only", "--out", str(out)]) == 2
    assert "already holds other files" in capsys.readouterr().err


def test_default_folders_are_unique_within_one_second(tmp_path, monkeypatch):
    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 11, 23, 22, 0, 0)

    monkeypatch.setattr(clock, "datetime", Frozen)
    monkeypatch.chdir(tmp_path)
    made = [config.prepare_out(None) for _ in range(3)]
    assert [p.name for p in made] == ["20261123-220000", "20261123-220000-2", "20261123-220000-3"]
    assert all(p.is_dir() and p.parent == Path("reports") for p in made)


def test_two_runs_started_together_get_their_own_folders(project):
    procs = [
        start("run", "--quiet", "--cpu-only", "--", "-k", "test_a", cwd=project) for _ in range(2)
    ]
    for p in procs:
        p.communicate(timeout=180)
        assert p.returncode == 0
    folders = sorted((project / "reports").iterdir())
    assert len(folders) == 2
    for folder in folders:  # each holds exactly one run with its one case
        recs = records(folder)
        assert [r["record"] for r in recs] == ["run", "plan", "case", "end"]


def test_resume_runs_only_what_an_interrupted_run_did_not_record(project):
    out = project / "out"
    proc, _ = start_until_stuck(project, out)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert f"gpucheck run --resume {out}" in stdout
    assert "stopped by Ctrl-C" in (out / "report.html").read_text()  # reports after Ctrl-C
    done_before = {r["case"] for r in results.cases(out / "results.jsonl")}
    assert done_before == {"test_mix.py::test_a", "test_mix.py::test_b"}
    again = gpucheck_run(project, "--cpu-only", "--out", str(out))  # refused: resume it
    assert again.returncode == 2 and f"`gpucheck run --resume {out}` continues" in again.stderr

    resumed = gpucheck_run(project, "--resume", str(out))  # no DEMO_HANG: test_hang passes
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr  # test_b's failure counts
    recs = records(out)
    kinds = Counter(r["record"] for r in recs)
    assert kinds == {"run": 1, "resume": 1, "plan": 2, "case": 5, "end": 2}
    ends = [r for r in recs if r["record"] == "end"]
    assert [e["interrupted"] for e in ends] == [True, False]
    run_ids = {r["run_id"] for r in recs}
    assert len(run_ids) == 1  # the same run, continued
    cases = Counter(r["case"] for r in recs if r["record"] == "case")
    assert all(n == 1 for n in cases.values()), cases  # nothing ran twice
    # the resumed worker's files come after the first one's (its state is the chain's last)
    skip = (out / "workers" / "cpu.blocking.1.skip.txt").read_text().split()
    assert sorted(skip) == sorted(done_before)
    # the summary counts this run's five cases once
    assert "5 case(s): 4 ran (3 passed, 1 failed), 1 skipped" in resumed.stdout
    # the worker's line says what its end means for the run, not pytest's exit code
    assert "cpu blocking: 5/5 cases, every case recorded" in resumed.stdout.splitlines()
    schema = results.schema()
    for line in recs:  # the resume record is part of the format
        jsonschema.validate(line, schema)


def test_resume_refuses_new_settings_and_folders_without_a_run(project, capsys):
    out = project / "out"
    assert (
        gpucheck_run(project, "--cpu-only", "--out", str(out), "--", "-k", "test_a").returncode == 0
    )
    assert cli.main(["run", "--resume", str(out), "--suite", "demo"]) == 2
    assert "drop --suite" in capsys.readouterr().err
    empty = project / "empty"
    empty.mkdir()
    assert cli.main(["run", "--resume", str(empty)]) == 2
    assert "holds no gpucheck run to resume" in capsys.readouterr().err
    # the header holds what a resume needs
    header = records(out)[0]
    assert header["config"]["pytest_args"] == ["-k", "test_a"]
    assert header["config"]["cpu_only"] is True
    assert header["config"]["suite_paths"] == {"demo": str(project / "suites" / "demo")}


def test_a_run_that_tested_nothing_exits_2_and_says_why(project):
    out = project / "out"
    proc = gpucheck_run(project, "--cpu-only", "--out", str(out), "--", "-k", "test_d")
    assert proc.returncode == 2
    assert "nothing was tested" in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last == (
        "nothing-tested (exit 2): 1 case(s): 0 ran (0 passed, 0 failed), 1 "
        "skipped: no CUDA device visible (1)"
    )
    allowed = gpucheck_run(
        project, "--cpu-only", "--allow-empty", "--out", str(project / "out2"), "--", "-k", "test_d"
    )
    assert allowed.returncode == 0
    assert "nothing was tested" not in allowed.stdout


def test_the_last_line_counts_every_status_and_the_skip_reasons(project):
    proc = gpucheck_run(project, "--cpu-only", "--out", str(project / "out"))
    last = proc.stdout.strip().splitlines()[-1]
    assert last == (
        "failed (exit 1): 5 case(s): 4 ran (3 passed, 1 failed), 1 skipped: "
        "no CUDA device visible (1)"
    )


# --- the compiled extension is missing -----------------------------------------------------


def test_the_kernel_suites_probe_names_the_fix_when_the_extension_is_not_built():
    from gpucheck._csrc import extension

    if extension.available():
        pytest.skip("gpucheck's extension is built in this environment")
    problem = config.suite_problem(declared(PROJECT_SUITES / "knn").probe or "")
    assert problem is not None
    assert "gpucheck's CUDA extension is not available" in problem
    assert "pip install --no-build-isolation -e ." in problem


def test_unbuilt_extension_is_one_sentence_before_any_worker(
    tmp_path, monkeypatch, capsys, two_gpus, harness_specs
):
    monkeypatch.setattr(config, "suite_problem", lambda probe: "EXTENSION MISSING; fix it so.")
    out = tmp_path / "out"
    code = cli.main(
        ["run", "--all-devices", "--suite", "knn", "--suite", "ssim", "--out", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        "gpucheck: EXTENSION MISSING; fix it so. Nothing was run: the suite(s) knn, ssim "
        "test gpucheck's own kernels."
    ]
    assert not harness_specs and not out.exists()


def test_user_suites_still_run_when_only_our_kernel_suites_cannot(
    project, monkeypatch, capsys, two_gpus, harness_specs
):
    monkeypatch.setattr(config, "suite_problem", lambda probe: "EXTENSION MISSING")
    out = project / "out"
    code = cli.main(
        [
            "run",
            "--all-devices",
            "--suite",
            str(project / "suites" / "demo"),
            "--suite",
            "knn",
            "--mode",
            "blocking",
            "--out",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert code == 2
    seen = [s for specs in harness_specs for s in specs]
    assert {tuple(s.suites) for s in seen} == {("demo",)}
    assert [s.label for s in seen] == ["cuda:0", "cuda:1"]
    assert "suite knn: not runnable: EXTENSION MISSING" in text
    header = records(out)[0]
    assert header["not_runnable"] == {"knn": "not runnable: EXTENSION MISSING"}


def test_kernel_suites_are_known_by_their_declaration():
    from gpucheck.controller.suites import needs_kernels

    assert needs_kernels(PROJECT_SUITES / "knn")
    assert needs_kernels(PROJECT_SUITES / "ssim" / "test_ssim.py")
    assert not needs_kernels(PROJECT_SUITES / "selftest")
    assert not needs_kernels(Path("/elsewhere/knn"))


def test_a_suite_declares_its_needs_and_probe_next_to_itself(tmp_path, monkeypatch):
    """Any suite folder (a user's too) may declare a probe: the run holds it back with the
    probe's reason; a declaration the controller cannot read is a usage problem."""
    from gpucheck.controller.suites import read_declaration
    from gpucheck.errors import UsageProblem

    mine = tmp_path / "suites" / "mine"
    mine.mkdir(parents=True)
    (mine / "test_mine.py").write_text("def test_x():\n    pass\n")
    (tmp_path / "mine_probe.py").write_text("def why():\n    return 'no widget here'\n")
    (mine / "suite.toml").write_text('needs = "kernels"\nprobe = "mine_probe:why"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert declared(mine / "test_mine.py").probe == "mine_probe:why"
    cfg = types.SimpleNamespace(cpu_only=False)
    other = tmp_path / "other"
    other.mkdir()
    runnable, reasons = config.select_runnable(cfg, {"mine": mine, "other": other})
    assert runnable == {"other": other}
    assert reasons == {"mine": "not runnable: no widget here"}
    (mine / "suite.toml").write_text('needs = "a quantum computer"\n')
    with pytest.raises(UsageProblem, match=r"suite\.toml"):
        read_declaration(mine / "suite.toml")


@pytest.mark.parametrize("suite", ["ssim", "knn"])
def test_both_kernel_suites_stop_once_under_plain_pytest(pytester, monkeypatch, suite):
    """On a GPU without the extension, our suites give one usage error with the fix, the same
    way for both (today knn failed each case and ssim skipped them)."""
    from gpucheck._csrc import extension
    from gpucheck.errors import ExtensionNotBuilt

    def missing():
        raise ExtensionNotBuilt("gpucheck's CUDA extension is not available (no _C); build it")

    from gpucheck.worker import targets

    monkeypatch.setattr(targets, "visible_cuda_count", lambda: 2)
    monkeypatch.setattr(extension, "load", missing)
    result = pytester.runpytest_inprocess(
        str(PROJECT_SUITES / suite), "--collect-only", "-q", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if "CUDA extension is not available" in line]
    assert len(errors) == 1 and "build it" in errors[0]


def test_kernel_suites_collect_without_gpu_and_their_cases_skip_for_that(pytester, monkeypatch):
    from gpucheck.worker import targets

    monkeypatch.setattr(targets, "visible_cuda_count", lambda: 0)
    result = pytester.runpytest_inprocess(
        str(PROJECT_SUITES / "knn"), "-q", "-rs", "-p", "no:cacheprovider", "-k", "not slow"
    )
    assert result.ret == pytest.ExitCode.OK
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) > 0 and "failed" not in outcomes
    assert any("no CUDA device visible" in line for line in result.outlines)


# --- case ids -------------------------------------------------------------------------------


def test_case_ids_are_relative_to_the_suite_root_wherever_it_is(tmp_path):
    elsewhere = tmp_path / "far" / "away" / "mysuite"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "sub" / "test_x.py").write_text(
        textwrap.dedent("""
        import os
        def test_ok():
            pass
        def test_crash():
            os.abort()
        def test_after():
            pass
    """)
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = tmp_path / "out"
    proc = gpucheck_run(cwd, "--cpu-only", "--suite", str(elsewhere), "--out", str(out))
    assert proc.returncode == 1
    recs = {r["case"]: r for r in results.cases(out / "results.jsonl")}
    assert set(recs) == {
        "sub/test_x.py::test_ok",
        "sub/test_x.py::test_crash",
        "sub/test_x.py::test_after",
    }
    assert recs["sub/test_x.py::test_crash"]["status"] == "crashed"
    assert {r["suite"] for r in recs.values()} == {"mysuite"}
    for r in recs.values():
        for f in r["findings"]:
            assert f["case"] == r["case"]
    # the fresh worker after the crash skipped exactly what was recorded, by the same ids
    skip = (out / "workers" / "cpu.blocking.1.skip.txt").read_text().split()
    assert sorted(skip) == ["sub/test_x.py::test_crash", "sub/test_x.py::test_ok"]
    json.dumps(recs)  # records stay plain JSON


@pytest.mark.parametrize("selection", [["--all-devices"], ["--device", "1"], []])
def test_a_gpu_run_resumes_with_the_devices_it_was_started_with(
    tmp_path, capsys, two_gpus, harness_specs, selection
):
    suite = tmp_path / "mine"
    suite.mkdir()
    (suite / "test_x.py").write_text("def test_x():\n    pass\n")
    out = tmp_path / "out"
    first = cli.main(["run", *selection, "--suite", str(suite), "--out", str(out)])
    kept = [r for r in records(out) if r["record"] != "end"]  # as if stopped before its end
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    again = cli.main(["run", "--resume", str(out)])
    err = capsys.readouterr().err
    assert (first, again) == (2, 2), err  # the fake harness ran nothing: nothing was tested
    assert "exclude each other" not in err
    seen = [[s.label for s in specs] for specs in harness_specs]
    assert seen[0] == seen[1] == (["cuda:1"] if "--device" in selection else ["cuda:0", "cuda:1"])


def test_a_harness_that_fails_still_leaves_its_reports(project, monkeypatch):
    from gpucheck.controller import harness

    def explode(self):
        raise RuntimeError("the harness broke")

    monkeypatch.setattr(harness.Harness, "run", explode)
    monkeypatch.chdir(project)
    out = project / "out"
    with pytest.raises(RuntimeError):
        cli.main(["run", "--cpu-only", "--quiet", "--out", str(out)])
    end = records(out)[-1]
    assert end["record"] == "end" and end["interrupted"] is True
    assert "the harness broke" in end["reason"]
    assert "the harness broke" in (out / "report.html").read_text()
    assert (out / "results.json").exists() and (out / "junit.xml").exists()


def test_sigterm_stops_the_run_like_ctrl_c_and_leaves_no_worker(project):
    """A cancelled CI job sends SIGTERM: finished cases kept, workers stopped, reports written,
    and the run can be resumed."""
    out = project / "out"
    proc, state = start_until_stuck(project, out)
    worker = json.loads(state.read_text())["pid"]
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert "interrupted: stopped by SIGTERM: finished cases were kept" in stdout
    end = records(out)[-1]
    assert end["record"] == "end" and "stopped by SIGTERM" in end["reason"]
    assert (out / "report.html").exists()
    with pytest.raises(ProcessLookupError):  # the stuck worker did not outlive the run
        for _ in range(50):
            os.kill(worker, 0)
            time.sleep(0.2)


# --- output for logs ------------------------------------------------------------------------

LOG_SUITE = textwrap.dedent("""
    import os, pytest

    @pytest.mark.parametrize("where", ["cuda0", "cuda1"])
    def test_ok(where):
        pass

    @pytest.mark.parametrize("where", ["cuda1"])
    def test_fails(where):
        assert [1] == [2]

    def test_dies():
        os.abort()

    def test_after_the_crash():
        pass
""")


def test_without_a_terminal_every_line_is_plain_and_printed_once(tmp_path):
    """Piped into a CI log: no rich markup ([red]...[/]), no ANSI escapes, no progress bar
    redrawn or rendered at the end; one line per finding as it is recorded and one per worker
    when it finishes; case ids with brackets printed as they are."""
    suite = tmp_path / "suites" / "logs"
    suite.mkdir(parents=True)
    (suite / "test_logs.py").write_text(LOG_SUITE)
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--out",
        str(tmp_path / "out"),
        cwd=tmp_path,
        timeout=180,
        env={"FORCE_COLOR": None, "TTY_COMPATIBLE": None},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "[red]" not in out and "[/" not in out and "[yellow]" not in out
    assert "\x1b[" not in out + proc.stderr
    # no progress bar, not even its last frame ("cpu blocking ━━━━ 5/5 findings 2 done")
    assert not [line for line in out.splitlines() if "━" in line and "findings" in line]
    lines = [line for line in out.splitlines() if line.strip()]
    text = [line for line in lines if not set(line) <= set("┏┓┗┛┡┩└┘━─┃│╇┳┻┴┬├┤ ")]
    repeated = [line for line, n in Counter(text).items() if n > 1]
    assert repeated == []
    # live: the findings as recorded, then the worker (restarted after the abort) once
    finding = "test-failure: cpu blocking test_logs.py::test_fails[cuda1]: assert [1] == [2]"
    crash = "crash: cpu blocking test_logs.py::test_dies: worker killed by SIGABRT"
    worker = "cpu blocking: 5/5 cases, 1 restart(s), every case recorded"
    assert lines.index(finding) < lines.index(worker)
    assert any(line.startswith(crash) for line in lines[: lines.index(worker)])
    # the summary: the findings grouped, then the verdict with the counts, last
    assert "symptoms no diagnosis explains: 2 group(s), 2 finding(s)" in lines
    assert (
        lines[-1] == "failed (exit 1): 5 case(s): 5 ran (3 passed, 1 failed, 1 crashed), 0 skipped"
    )
    table = out[out.index("gpucheck summary") :]
    assert "logs" in table and "…" not in table  # a log is not folded to 80 columns


@pytest.mark.parametrize(
    ("worker", "said"),
    [
        ({"planned": 5, "done": 5}, "every case recorded"),
        ({"planned": 5, "done": 3}, "2 case(s) not recorded"),
        ({"planned": 0, "done": 0}, "collected no case"),
        ({"planned": None, "done": 0}, "collected no case (its stderr: w/cpu.err.log)"),
        (
            {"planned": 5, "done": 2, "worker_error": True},
            "stopped outside any case (its worker-error record says why)",
        ),
    ],
)
def test_a_worker_line_says_what_the_workers_end_means_for_the_run(
    tmp_path, monkeypatch, worker, said
):
    from gpucheck.controller.progress import ending

    monkeypatch.chdir(tmp_path)
    w = types.SimpleNamespace(
        **{"worker_error": False, "stderr_path": tmp_path / "w" / "cpu.err.log", **worker}
    )
    assert ending(w) == said  # type: ignore[arg-type]


def test_resume_of_a_finished_run_is_refused_in_one_line_and_adds_nothing(project):
    out = project / "out"
    assert (
        gpucheck_run(project, "--cpu-only", "--out", str(out), "--", "-k", "test_a").returncode == 0
    )
    before = (out / "results.jsonl").read_bytes()
    workers = sorted(p.name for p in (out / "workers").iterdir())
    proc = gpucheck_run(project, "--resume", str(out))
    assert proc.returncode == 2
    assert proc.stdout == ""
    finished = records(out)[-1]["finished_at"]
    assert proc.stderr.strip().splitlines() == [
        f"gpucheck: the run in {str(out)!r} finished at {finished}: there is nothing to "
        f"resume (`gpucheck report {out}` writes its reports again)"
    ]
    assert (out / "results.jsonl").read_bytes() == before  # no second end record
    assert sorted(p.name for p in (out / "workers").iterdir()) == workers  # no worker


def test_resume_of_a_folder_without_its_workers_folder_runs_the_rest(project):
    """A run folder copied without its logs (an artifact of results.jsonl alone) resumes."""
    import shutil

    out = project / "out"
    assert gpucheck_run(project, "--cpu-only", "--out", str(out)).returncode == 1
    recs = records(out)
    kept = [r for r in recs if r["record"] == "run" or r.get("case") == "test_mix.py::test_a"]
    shutil.rmtree(out / "workers")
    for name in ("results.json", "report.html", "junit.xml"):
        (out / name).unlink()
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    proc = gpucheck_run(project, "--resume", str(out))
    assert "make room" not in proc.stdout + proc.stderr
    assert proc.returncode == 1, proc.stdout + proc.stderr  # test_b fails, as before
    cases = Counter(r["case"] for r in records(out) if r["record"] == "case")
    assert cases == Counter(r["case"] for r in recs if r["record"] == "case")  # each once
