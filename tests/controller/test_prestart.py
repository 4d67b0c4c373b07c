"""The first worker's interpreter, started before the command line is read
(gpucheck.controller.prestart): a worker it runs sees what a freshly started one sees; any
command it could not run as such starts afresh; one nobody takes ends."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from clirun import gpucheck
from workerkit import run_cpu_worker

from gpucheck.controller import prestart

SUITE = """
import json, os, sys
from pathlib import Path


def test_what_the_worker_sees():
    os.write(1, b"to the worker's stdout")  # past pytest's capture, as native code writes
    os.write(2, b"to the worker's stderr")
    env = {k: v for k, v in os.environ.items() if k.startswith(("GPUCHECK_", "PREST_", "PYTHON"))}
    run = Path(sys.argv[sys.argv.index("--gpucheck-results") + 1]).parent
    (run / "seen.json").write_text(json.dumps({
        "argv": sys.argv[1:],
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "env": env,
        "stdin": os.path.samestat(os.fstat(0), os.stat(os.devnull)),
        "session": os.getsid(0) == os.getpid(),
        "parent": os.getppid(),
        "waited": b"readline" in Path("/proc/self/cmdline").read_bytes(),
    }))
"""


@pytest.fixture
def waiting(monkeypatch):
    """No interpreter left from another test; whatever this one starts is let go after it."""
    monkeypatch.setattr(prestart, "_WAITING", [])
    yield prestart._WAITING
    prestart.release()


def _run(tmp_path: Path, name: str) -> tuple[dict, Path, int | None]:
    suite = tmp_path / "suite"
    suite.mkdir(exist_ok=True)
    (suite / "test_sees.py").write_text(SUITE)
    out = tmp_path / name
    records, harness = run_cpu_worker(suite, out)
    status = [r["status"] for r in records if r["record"] == "case"]
    assert status == ["passed"]
    return (
        json.loads((out / "seen.json").read_text()),
        out / "workers",
        harness.workers[0].proc.returncode,
    )


def test_a_worker_in_the_waiting_interpreter_sees_what_a_fresh_one_sees(
    tmp_path, monkeypatch, waiting
):
    fresh, fresh_logs, fresh_code = _run(tmp_path, "fresh")
    prestart.start(["run", "--cpu-only"])
    assert len(waiting) == 1
    taken, taken_logs, taken_code = _run(tmp_path, "taken")
    assert not waiting  # it was taken
    assert (fresh["waited"], taken["waited"]) == (False, True)
    assert fresh_code == taken_code == 0
    for key in ("path0", "cwd", "stdin", "session", "parent"):
        assert fresh[key] == taken[key], key
    assert fresh["stdin"] and fresh["session"] and fresh["parent"] == os.getpid()
    # the arguments and environment alike, but for the run's own folder
    assert [a.replace("/taken/", "/fresh/") for a in taken["argv"]] == fresh["argv"]
    assert taken["argv"] != fresh["argv"]
    assert {k: v.replace("/taken/", "/fresh/") for k, v in taken["env"].items()} == fresh["env"]
    for logs in (fresh_logs, taken_logs):
        assert "to the worker's stdout" in next(logs.glob("*.out.log")).read_text()
        assert "to the worker's stderr" in next(logs.glob("*.err.log")).read_text()
        assert "-c" in next(logs.glob("*.cmd")).read_text()


def test_a_variable_read_at_python_start_makes_the_worker_start_afresh(
    tmp_path, monkeypatch, waiting
):
    prestart.start(["run"])
    proc = waiting[0][0]
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # changed after the interpreter started
    seen, _, code = _run(tmp_path, "afresh")
    assert (seen["waited"], code) == (False, 0)
    assert seen["env"]["PYTHONPATH"] == str(tmp_path)
    assert proc.wait(timeout=60) == 0  # let go: it ended on its own


def test_another_command_starts_afresh_and_lets_the_interpreter_go(waiting):
    prestart.start(["run"])
    proc = waiting[0][0]
    env = dict(os.environ, **prestart.STARTUP_ENV)
    assert prestart.take([sys.executable, "-m", "pytest"], env, os.devnull, os.devnull) is None
    assert proc.wait(timeout=60) == 0
    assert prestart.take([sys.executable, "-c", prestart.QUICK_EXIT], env, "", "") is None


def test_an_interpreter_nobody_takes_ends_with_the_controller(tmp_path):
    """The controller's end (here: a run refused before any worker) closes its stdin."""
    mark = f"PREST_MARK={tmp_path}".encode()
    done = gpucheck(
        "run",
        "--cpu-only",
        "--suite",
        str(tmp_path / "no-such-suite"),
        env={"PREST_MARK": str(tmp_path)},
    )
    assert done.returncode != 0 and "no-such-suite" in done.stderr
    deadline = time.monotonic() + 30
    while (left := _waiting_with(mark)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []


def _waiting_with(mark: bytes) -> list[str]:
    """The waiting interpreters (alive) whose environment holds ``mark``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and b"sys.stdin.readline" in (proc / "cmdline").read_bytes()
                and mark in (proc / "environ").read_bytes().split(b"\0")
                and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
            ):
                found.append(proc.name)
        except OSError:  # gone meanwhile
            continue
    return found


def test_without_a_python_to_start_none_waits(monkeypatch, waiting):
    monkeypatch.setattr(sys, "executable", "")
    prestart.start(["run"])
    assert waiting == []


@pytest.mark.parametrize(
    ("argv", "wanted"),
    [
        (["run"], True),
        (["run", "--cpu-only", "--suite", "x", "--", "-k", "--help"], True),
        (["run", "--distributed"], False),
        (["run", "--ray"], False),
        (["run", "--ray=auto"], False),
        (["run", "--help"], False),
        (["report", "RUN"], False),
        ([], False),
    ],
)
def test_which_command_lines_start_one(argv, wanted):
    assert prestart.wanted(argv) is wanted
