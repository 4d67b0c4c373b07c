"""The fault-injection matrix of docs/faults.md, the faults of the machine around a run rather
than of its cases (the kernels' build: tests/csrc/test_kernel_build.py). Each test makes its
fault for real, in real processes, and asserts the outcome written in docs/faults.md: the run
goes on where it can; every record written before the fault is intact and readable; the fault is
a finding, or one line with a non-zero exit; nothing that did not run counts as passed; the
report still renders.

This machine has no GPU and no NVIDIA driver. Where a fault needs one (two runs on one GPU,
NVML failing under a run), a real shared library stands in for the driver's NVML
(tests/fixtures/faults/nvml_shim.c, loaded by pynvml through LD_LIBRARY_PATH): it answers as a
one-GPU driver and fails, as a driver does, once a file exists. Everything else is the real
thing: signals, binaries missing from PATH, a ptrace the kernel refuses, a C call holding the
GIL, a tool that kills itself."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from clirun import gpucheck
from faultkit import (
    assert_kept,
    by_case,
    dead,
    drop_capabilities,
    make_suite,
    report,
    run,
    start,
    wait_for,
    worker_pid,
)

from gpucheck.controller.harness import Harness, WorkerSpec
from gpucheck.model import results
from gpucheck.model.layout import RunFolder

HERE = Path(__file__).resolve().parents[1]
SHIM_SOURCE = HERE / "fixtures" / "faults" / "nvml_shim.c"
SHIM_UUID = "GPU-5a1e0000-0000-4000-8000-000000000001"  # the one GPU the shim knows
MIB = 1 << 20
CAP_SYS_PTRACE = 19
TRIVIAL = {"test_a.py": "def test_a():\n    pass\n"}


def _cannot(why: str) -> None:
    """No tool to make the fault with: a failure on CI (it has them), a skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def nvml_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the shim built as libnvidia-ml.so.1 (for LD_LIBRARY_PATH)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        pass
    else:
        pytest.skip(
            "a CUDA driver is installed here: discovery would see its GPUs, not the "
            "shim's (these tests stand in for a GPU machine on one without)"
        )
    folder = tmp_path_factory.mktemp("nvml-shim")
    try:
        made = subprocess.run(
            [
                os.environ.get("CC", "cc"),
                "-shared",
                "-fPIC",
                "-o",
                str(folder / "libnvidia-ml.so.1"),
                str(SHIM_SOURCE),
                "-ldl",
            ],
            capture_output=True,
            text=True,
        )
    except OSError as err:
        _cannot(f"no C compiler to build the NVML shim: {err}")
    if made.returncode != 0:
        _cannot(f"the NVML shim did not build: {made.stderr[-500:]}")
    return folder


def _py_spy_path() -> str:
    """A PATH holding py-spy (a test dependency: pyproject's test extra), this one first."""
    here = Path(sys.executable).parent
    found = shutil.which("py-spy", path=f"{os.environ.get('PATH', '')}{os.pathsep}{here}")
    if found is None:
        pytest.fail("py-spy is not installed (pip install -e .[test])")
    return os.pathsep.join([str(Path(found).parent), os.environ.get("PATH", "")])


def _py_spy_may_read_a_sibling(path: str) -> bool:
    """Whether py-spy, started beside a process (as the controller starts it beside a worker),
    may read it here: ptrace_scope 1 and a container's seccomp may refuse it."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        probe = subprocess.run(
            ["py-spy", "dump", "--pid", str(sleeper.pid)],
            capture_output=True,
            env={**os.environ, "PATH": path},
            timeout=30,
        )
        return probe.returncode == 0
    finally:
        sleeper.kill()
        sleeper.wait()


# --- two runs started on the same GPU at once -----------------------------------------------


def test_a_second_run_on_the_same_gpu_is_refused_or_queued(tmp_path, nvml_shim):
    """The shim is the NVML of one GPU, so discovery and the device lock see cuda:0 (its
    workers then find no CUDA device in this CPU torch and end at start-up, a worker-error:
    not what this test is about). The first run is stopped (SIGSTOP) once it holds the GPU,
    as a long run holds it; three more start on the same GPU meanwhile."""
    make_suite(tmp_path, "demo", TRIVIAL)
    env = {"LD_LIBRARY_PATH": str(nvml_shim), "GPUCHECK_LOCK_DIR": str(tmp_path / "locks")}
    args = ("--suite", "suites/demo", "--out")
    first = start(tmp_path, *args, str(tmp_path / "first"), env=env, cpu=False)
    lock = tmp_path / "locks" / f"{SHIM_UUID}.lock"
    wait_for(lambda: json.loads(lock.read_text())["out"])  # it holds cuda:0, names its folder
    os.kill(first.pid, signal.SIGSTOP)
    with open(tmp_path / "queued.err", "w") as queued_err:
        try:
            refused = start(tmp_path, *args, str(tmp_path / "refused"), env=env, cpu=False)
            timed = start(
                tmp_path,
                *args,
                str(tmp_path / "timed"),
                "--wait-for-devices",
                "1",
                env=env,
                cpu=False,
            )
            queued = start(
                tmp_path,
                *args,
                str(tmp_path / "queued"),
                "--wait-for-devices",
                "120",
                env=env,
                cpu=False,
                stderr=queued_err,
            )
            said = {
                "refused": refused.communicate(timeout=60)[1],
                "timed": timed.communicate(timeout=60)[1],
            }
            wait_for(
                lambda: (
                    "gpucheck: waiting up to 120 s for cuda:0"
                    in (tmp_path / "queued.err").read_text()
                )
            )
            assert queued.poll() is None  # still waiting
        finally:
            os.kill(first.pid, signal.SIGCONT)
        first.communicate(timeout=120)
        queued.communicate(timeout=120)
    for name, proc in (("refused", refused), ("timed", timed)):
        assert proc.returncode == 2, said[name]
        assert "Traceback" not in said[name]
        (line,) = [
            x
            for x in said[name].splitlines()
            if x.startswith("gpucheck: ") and not x.startswith("gpucheck: waiting")
        ]
        assert line.startswith(f"gpucheck: cuda:0 ({SHIM_UUID}) ")
        assert f"pid {first.pid} " in line and f"run folder {tmp_path / 'first'}" in line
        assert "--wait-for-devices" in line and "nothing was run" in line
        assert ("after 1 s" in line) == (name == "timed")
        assert not (tmp_path / name).exists()  # nothing ran: no run folder either
    # the first run is whole; the queued one ran once the first had ended
    kept = assert_kept(tmp_path / "first")
    ended = datetime.fromisoformat(next(r for r in kept if r["record"] == "end")["finished_at"])
    header = assert_kept(tmp_path / "queued")[0]
    assert header["record"] == "run" and datetime.fromisoformat(header["started_at"]) >= ended
    assert queued.returncode == 1  # its worker-error (no CUDA here), not a refusal
    assert (tmp_path / "first" / "report.html").exists()


def test_resuming_a_run_that_is_still_going_is_refused(tmp_path):
    """--resume of a folder whose run is under way would record its cases twice: its folder
    is locked too (a --cpu-only run, which locks no device)."""
    make_suite(
        tmp_path,
        "demo",
        {
            "test_slow.py": """
        import os, time
        def test_slow():
            open(os.environ["FAULT_INSIDE"], "w").close()
            while not os.path.exists(os.environ["FAULT_GO"]):
                time.sleep(0.05)
    """
        },
    )
    out, inside, go = tmp_path / "out", tmp_path / "inside", tmp_path / "go"
    env = {
        "GPUCHECK_LOCK_DIR": str(tmp_path / "locks"),
        "FAULT_INSIDE": str(inside),
        "FAULT_GO": str(go),
    }
    going = start(tmp_path, "--out", str(out), env=env)
    wait_for(inside.exists)
    second = run(tmp_path, "--resume", str(out), env=env)
    go.touch()
    assert second.returncode == 2, second.stdout + second.stderr
    (line,) = second.stderr.strip().splitlines()
    assert f"the run folder {out} is in use by another gpucheck run (pid {going.pid} " in line
    assert "still running" in line
    going.communicate(timeout=60)
    assert going.returncode == 0
    assert [r["record"] for r in assert_kept(out)] == ["run", "plan", "case", "end"]  # no resume


# --- a hang in C code that holds the GIL ------------------------------------------------------

GIL_SUITE = {
    "test_gil.py": """
    import ctypes, os, threading, time

    def _beat(path):
        n = 0
        while True:
            n += 1
            with open(path + ".tmp", "w") as f:
                f.write(str(n))
            os.replace(path + ".tmp", path)
            time.sleep(0.01)

    def test_holds_the_gil():
        threading.Thread(target=_beat, args=(os.environ["FAULT_BEAT"],), daemon=True).start()
        time.sleep(0.2)
        api = ctypes.pythonapi  # a PyDLL: its calls keep the GIL (ctypes.CDLL's release it)
        api.PyThread_allocate_lock.restype = ctypes.c_void_p
        api.PyThread_acquire_lock.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lock = api.PyThread_allocate_lock()
        api.PyThread_acquire_lock(lock, 1)
        open(os.environ["FAULT_INSIDE"], "w").close()
        api.PyThread_acquire_lock(lock, 1)  # waits in C for ever, the GIL held

    def test_after():
        pass
"""
}


def _gil_held(beat: Path) -> bool:
    """The case's other thread, which needs the GIL to write, has stopped writing."""
    before = beat.read_text()
    time.sleep(0.5)
    return beat.read_text() == before


def test_a_hang_in_c_code_holding_the_gil_still_has_its_stacks(tmp_path):
    """faulthandler's SIGUSR1 handler is C code: it writes every thread's Python stack while a
    C call holds the GIL; py-spy (a test dependency) adds the native frames, where it may
    read the worker."""
    make_suite(tmp_path, "demo", GIL_SUITE)
    out, inside, beat = tmp_path / "out", tmp_path / "inside", tmp_path / "beat"
    path = _py_spy_path()
    proc = start(
        tmp_path,
        "--out",
        str(out),
        "--timeout",
        "4",
        env={"FAULT_INSIDE": str(inside), "FAULT_BEAT": str(beat), "PATH": path},
    )
    wait_for(inside.exists)
    assert _gil_held(beat)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stdout + stderr
    recs = by_case(out)
    assert {k: r["status"] for k, r in recs.items()} == {
        "test_holds_the_gil": "hung",
        "test_after": "passed",
    }
    evidence = recs["test_holds_the_gil"]["findings"][0]["evidence"]
    python, native = evidence.split("--- native frames (py-spy dump --native) ---\n")
    lines = python.splitlines()  # the running thread first, its innermost frame first
    assert lines[1].startswith("Current thread") and "in test_holds_the_gil" in lines[2]
    if _py_spy_may_read_a_sibling(path):
        # py-spy's own frame of the case (native frames below it), after its thread's line
        assert re.search(r"^\s+test_holds_the_gil \(\S*test_gil\.py:\d+\)$", native, re.M)
        assert native.splitlines()[0].startswith("Thread ") and "MainThread" in native
    else:
        assert native.startswith("py-spy dump failed") and "ptrace" in native
    assert_kept(out)
    assert "test_holds_the_gil" in (out / "report.html").read_text()


def test_a_worker_holding_the_gil_dies_with_its_controller(tmp_path):
    """The lifeline's thread needs the GIL to end a worker whose controller died: the kernel's
    parent-death signal does not."""
    make_suite(tmp_path, "demo", GIL_SUITE)
    out, inside, beat = tmp_path / "out", tmp_path / "inside", tmp_path / "beat"
    proc = start(
        tmp_path, "--out", str(out), env={"FAULT_INSIDE": str(inside), "FAULT_BEAT": str(beat)}
    )
    wait_for(inside.exists)
    worker = worker_pid(out)
    assert _gil_held(beat)
    proc.kill()
    proc.communicate(timeout=30)
    wait_for(lambda: dead(worker), timeout=10)
    assert assert_kept(out)[0]["record"] == "run"  # no record of the case, nothing after


# --- py-spy missing or refused -----------------------------------------------------------------


@pytest.mark.parametrize("how", ["missing", "refused"])
def test_py_spy_missing_or_refused_leaves_the_python_stacks(tmp_path, how):
    """missing: a PATH without py-spy. refused: the case makes its process non-dumpable
    (prctl PR_SET_DUMPABLE 0), so the kernel lets no one without CAP_SYS_PTRACE read it; as
    root, the run is started without that capability."""
    make_suite(
        tmp_path,
        "demo",
        {
            "test_stuck.py": """
        import ctypes, time
        def test_stuck():
            assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE 0
            time.sleep(60)
        def test_after():
            pass
    """
        },
    )
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    path = str(tmp_path / "empty") if how == "missing" else _py_spy_path()
    root = how == "refused" and os.geteuid() == 0
    proc = run(
        tmp_path,
        "--out",
        str(out),
        "--timeout",
        "2",
        env={"PATH": path},
        preexec_fn=(lambda: drop_capabilities(CAP_SYS_PTRACE)) if root else None,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = by_case(out)
    assert {k: r["status"] for k, r in recs.items()} == {
        "test_stuck": "hung",
        "test_after": "passed",
    }
    evidence = recs["test_stuck"]["findings"][0]["evidence"]
    python, native = evidence.split("--- native frames (py-spy dump --native) ---\n")
    assert "in test_stuck" in python
    if how == "missing":
        assert (
            native == "note: py-spy is not installed (not on PATH): no native frames (pip "
            "install py-spy to see where a process is stuck inside C++/CUDA)"
        )
    else:
        (said,) = native.splitlines()
        assert said.startswith("py-spy dump failed (exit 1): ") and "ptrace" in said
        assert "Permission denied" in said or "not permitted" in said
    assert_kept(out)
    assert report(out, tmp_path / "page.html").returncode == 1


# --- NVML failing mid-run ----------------------------------------------------------------------

#: the controller's side of a pass in mode nvml (pipeline.Run.harness_pass: the workers and
#: the parent's NVML timeline), in a process of its own: the shim is loaded at its start
NVML_PASS = """\
import json, sys
from pathlib import Path
from gpucheck.controller import pipeline
from gpucheck.controller.config import RunConfig, make_console
from gpucheck.controller.progress import Progress
from gpucheck.controller.spawning import WorkerSpec
from gpucheck.model.runlog import RunLog
out, suite, uuid = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
out.mkdir()
spec = WorkerSpec("cpu", None, uuid, {"demo": suite}, "nvml", {"CUDA_VISIBLE_DEVICES": ""},
                  [], 0.02)
run = pipeline.Run(RunConfig(timeout=60.0))
run.out, run.run_id = out, "r1"
with Progress(make_console(), quiet=True) as progress:
    run.harness_pass([spec], RunLog(out / "results.jsonl"), progress, 0.02)
print(json.dumps(run.notes))
"""


def test_nvml_failing_mid_run_is_a_warning_per_case_and_a_gap(tmp_path, nvml_shim):
    """The shim answers as a driver with one GPU until the case test_breaks makes its flag
    file; from then on every query fails with NVML_ERROR_UNKNOWN, in the worker (its
    per-case peaks) and in the controller (the timeline). A mode-nvml pass on a worker
    labelled cpu whose NVML device is the shim's (a CPU torch has no cuda:0 to target)."""
    flag = tmp_path / "nvml-broken"
    suite = make_suite(
        tmp_path,
        "demo",
        {
            "test_nvml.py": """
        import os, time
        def test_before():
            time.sleep(0.2)
        def test_breaks():
            open(os.environ["GPUCHECK_SHIM_NVML_FAIL"], "w").close()
            time.sleep(0.2)
        def test_after():
            time.sleep(0.2)
    """
        },
    )
    out = tmp_path / "out"
    env = {**os.environ, "LD_LIBRARY_PATH": str(nvml_shim), "GPUCHECK_SHIM_NVML_FAIL": str(flag)}
    proc = subprocess.run(
        [sys.executable, "-c", NVML_PASS, str(out), str(suite), SHIM_UUID],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    notes = json.loads(proc.stdout.strip().splitlines()[-1])
    recs = by_case(out)
    assert {k: r["status"] for k, r in recs.items()} == dict.fromkeys(
        ("test_before", "test_breaks", "test_after"), "passed"
    )  # the cases' results stand
    assert recs["test_before"]["memory"]["nvml_peak_used"] == 256 * MIB
    assert recs["test_before"]["findings"] == []
    for name in ("test_breaks", "test_after"):
        memory, findings = recs[name]["memory"], recs[name]["findings"]
        assert "nvml_peak_used" not in memory  # unknown (not written), not 0
        (warning,) = findings
        assert warning["kind"] == "nvml-error" and warning["severity"] == "warning"
        assert "NVMLError_Unknown: Unknown Error" in warning["message"]
    (failed,) = [n for n in notes if "NVML failed" in n]
    assert "(NVMLError_Unknown: Unknown Error)" in failed
    samples = [json.loads(x) for x in (out / "nvml_timeline.jsonl").read_text().splitlines()]
    rows = [s["devices"][0] for s in samples]
    broken = [i for i, row in enumerate(rows) if row.get("error")]
    assert broken and broken[0] > 0 and broken == list(range(broken[0], len(rows)))
    assert all(rows[i]["processes"] is None for i in broken)  # none listed, not "no process"
    assert rows[0]["used"] == 256 * MIB
    assert_kept(out)
    page = tmp_path / "page.html"
    report(out, page)
    assert "test_breaks" in page.read_text()


# --- compute-sanitizer missing, or crashing itself --------------------------------------------


def test_compute_sanitizer_missing_is_one_line_before_anything_runs(tmp_path):
    """Not on PATH, nor in $CUDA_HOME/bin (CUDA_HOME set: /usr/local/cuda is not looked at)."""
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    proc = gpucheck(
        "run",
        "--mode",
        "sanitizer:memcheck",
        "--out",
        str(out),
        timeout=60,
        cwd=tmp_path,
        env={
            "PATH": str(tmp_path / "empty"),
            "CUDA_HOME": str(tmp_path / "empty"),
            "CUDA_PATH": "",
        },
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert (
        line.startswith(
            "gpucheck: compute-sanitizer was not found on PATH nor in "
            f"{tmp_path / 'empty' / 'bin'} "
        )
        and "nothing was run" in line
    )
    assert not out.exists()


#: compute-sanitizer that crashes (SIGSEGV): at its start (FAULT_TOOL_START), or once the
#: case under way made the file FAULT_INSIDE (once: it renames the file)
CRASHING_TOOL = """\
#!/usr/bin/env bash
while [ $# -gt 0 ]; do case "$1" in --*) shift 2 ;; *) break ;; esac; done
crash() { echo "========= Internal Sanitizer Error: the tool crashed" >&2; kill -SEGV $$; }
[ -n "${FAULT_TOOL_START:-}" ] && crash
"$@" &
child=$!
while kill -0 "$child" 2>/dev/null; do
  if [ -e "$FAULT_INSIDE" ]; then mv "$FAULT_INSIDE" "$FAULT_INSIDE.seen"; crash; fi
  sleep 0.05
done
wait "$child"
"""


@pytest.mark.parametrize("when", ["mid-case", "at-start"])
def test_compute_sanitizer_crashing_itself(tmp_path, when):
    """mid-case: the tool dies while its worker runs a case: that case is an error of its own
    kind (the tool crashed, not the case, whose outcome is unknown); the worker under it is
    killed; a fresh tool and worker run the rest. at-start: every start of the tool dies: a
    worker-error, one fresh start, a second worker-error, and no case counts as run."""
    if shutil.which("bash") is None:
        _cannot("needs bash")
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(CRASHING_TOOL)
    tool.chmod(0o755)
    suite = make_suite(
        tmp_path,
        "san",
        {
            "test_san.py": """
        import os, pytest, time
        @pytest.mark.sanitizer
        def test_before():
            pass
        @pytest.mark.sanitizer
        def test_victim():
            open(os.environ["FAULT_INSIDE"], "w").close()
            time.sleep(60)
        @pytest.mark.sanitizer
        def test_after():
            pass
    """
        },
    )
    out = tmp_path / "out"
    out.mkdir()
    env = {
        "FAULT_INSIDE": str(tmp_path / "inside"),
        **({"FAULT_TOOL_START": "1"} if when == "at-start" else {}),
    }
    spec = WorkerSpec(
        "cpu",
        None,
        None,
        {"san": suite},
        "sanitizer:memcheck",
        env,
        sanitizer_tool="memcheck",
        sanitizer=tool,
    )
    t0 = time.monotonic()
    Harness([spec], out, out / "results.jsonl", "r1", timeout=60).run()
    assert time.monotonic() - t0 < 50  # not the victim's sleep, nor the --timeout
    if when == "mid-case":
        recs = by_case(out)
        assert {k: r["status"] for k, r in recs.items()} == {
            "test_before": "passed",
            "test_victim": "error",
            "test_after": "passed",
        }
        (finding,) = recs["test_victim"]["findings"]
        assert finding["kind"] == "sanitizer-crash" and recs["test_victim"]["signal"] == "SIGSEGV"
        assert finding["message"].startswith("compute-sanitizer (pid ")
        assert "killed by SIGSEGV while this case ran (the worker under it" in finding["message"]
        assert "Internal Sanitizer Error" in finding["evidence"]
        state = RunFolder(out).worker("cpu", "sanitizer:memcheck").state
        first = int(json.loads(state.read_text())["pid"])
        assert dead(first)  # the worker the tool left behind did not outlive it
    else:
        errors = results.cases(out / "results.jsonl")
        assert [r["status"] for r in errors] == ["error", "error"]  # one fresh start, no more
        for r in errors:
            assert r["findings"][0]["kind"] == "worker-error"
            assert "compute-sanitizer (pid " in r["reason"] and "SIGSEGV" in r["reason"]
    assert_kept(out)
    page = tmp_path / "page.html"
    assert report(out, page).returncode == 1 and page.exists()
    assert not [
        r
        for r in results.cases(out / "results.jsonl")
        if r["status"] == "passed" and r["case"].endswith("test_victim")
    ]
