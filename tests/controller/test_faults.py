"""The fault-injection matrix of docs/faults.md, the faults of the cases' own doing: ``gpucheck
run`` survives what it finds and loses nothing. Each test injects its fault for real into real
worker processes (a real signal, a real full file system or file size limit, a real read-only
folder, real os._exit / os.fork / os.chdir calls, a real import error) and asserts the outcome
written in docs/faults.md: the run goes on where it can; every record written before the fault
is intact and readable; the fault is a finding, or one line with a non-zero exit; nothing that
did not run counts as passed; the report still renders."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from faultkit import (
    assert_kept,
    by_case,
    dead,
    drop_capabilities,
    in_case,
    make_suite,
    report,
    run,
    start,
    wait_for,
    worker_pid,
)

from gpucheck.controller.spawning import LOG_CAP, LOG_KEEP
from gpucheck.model import results

# --- a worker SIGKILLed mid-case -------------------------------------------------------------


def test_a_worker_sigkilled_while_starting_is_replaced_once(tmp_path):
    """The signal comes before the worker's first case (its conftest kills the process the
    first time it is imported, as the OOM killer would during torch's import): a worker-error
    finding, then a fresh worker runs every case. A second kill in a row ends that device's
    part of the run (no endless restarts of a start-up that always dies)."""
    make_suite(
        tmp_path,
        "demo",
        {
            "conftest.py": """
            import os, signal
            marker = os.environ["FAULT_MARKER"]
            if os.environ.get("FAULT_ALWAYS") or not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        """,
            "test_a.py": """
            def test_one():
                pass
            def test_two():
                pass
        """,
        },
    )
    out = tmp_path / "out"
    proc = run(tmp_path, "--out", str(out), env={"FAULT_MARKER": str(tmp_path / "m1")})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = by_case(out)
    assert {k: r["status"] for k, r in recs.items() if not k.startswith("<")} == {
        "test_one": "passed",
        "test_two": "passed",
    }
    errors = [r for k, r in recs.items() if k.startswith("<")]
    assert len(errors) == 1 and errors[0]["findings"][0]["kind"] == "worker-error"
    assert "SIGKILL" in errors[0]["reason"] and "fresh worker" in errors[0]["reason"]
    assert_kept(out)
    out2 = tmp_path / "out2"
    proc = run(
        tmp_path,
        "--out",
        str(out2),
        env={"FAULT_MARKER": str(tmp_path / "m2"), "FAULT_ALWAYS": "1"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    kinds = [r["status"] for r in results.cases(out2 / "results.jsonl")]
    assert kinds == ["error", "error"]  # the first kill and the one after the restart


def test_a_worker_sigkilled_mid_case_is_a_crash_and_the_run_goes_on(tmp_path):
    """The OOM killer's signal, sent from outside to the worker while a case runs."""
    make_suite(
        tmp_path,
        "demo",
        {
            "test_kill.py": """
        import os, time
        def test_before():
            pass
        def test_victim():
            if os.environ.get("FAULT_INSIDE"):
                open(os.environ["FAULT_INSIDE"], "w").close()
                time.sleep(120)
        def test_after():
            pass
    """
        },
    )
    out, inside = tmp_path / "out", tmp_path / "inside"
    proc = start(tmp_path, "--out", str(out), env={"FAULT_INSIDE": str(inside)})
    wait_for(inside.exists)
    victim = worker_pid(out)
    os.kill(victim, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stdout + stderr
    recs = by_case(out)
    assert {k: r["status"] for k, r in recs.items()} == {
        "test_before": "passed",
        "test_victim": "crashed",
        "test_after": "passed",
    }
    crash = recs["test_victim"]
    assert crash["signal"] == "SIGKILL"
    assert "out-of-memory killer" in crash["findings"][0]["hint"]
    assert_kept(out)
    assert "1 crashed" in stdout.strip().splitlines()[-1] or "crashed" in stdout
    assert "test_victim" in (out / "report.html").read_text()


# --- the parent SIGKILLed mid-run, then --resume ---------------------------------------------


def test_the_parent_sigkilled_mid_run_leaves_no_worker_and_resume_finishes(tmp_path):
    """The worker ends with its controller; what a case started in a session of its own is
    out of its process group and stays, in the worker's cgroup where it has one: the next
    run (here the resume) ends what the cgroups of a run that is gone hold."""
    from gpucheck.processes import Cgroup

    probe = Cgroup.make("probe")  # (this process's sweep of stale cgroups happens here)
    if probe is not None:
        probe.kill()
    make_suite(
        tmp_path,
        "demo",
        {
            "test_parent.py": """
        import os, subprocess, time
        def test_a():
            pass
        def test_b():
            child = subprocess.Popen(["sleep", "301"], start_new_session=True)
            with open(os.environ["FAULT_PID"], "w") as f:
                f.write(str(child.pid))
        def test_slow():
            go = os.environ["FAULT_GO"]
            while not os.path.exists(go):
                time.sleep(0.05)
        def test_c():
            pass
        def test_d():
            pass
    """
        },
    )
    out, go, pid_file = tmp_path / "out", tmp_path / "go", tmp_path / "pid"
    env = {"FAULT_GO": str(go), "FAULT_PID": str(pid_file)}
    proc = start(tmp_path, "--out", str(out), env=env)
    wait_for(in_case(out, "test_slow"))
    worker = worker_pid(out)
    proc.kill()  # SIGKILL: no handler runs, no end record, no report
    proc.communicate(timeout=30)
    wait_for(lambda: dead(worker), timeout=10)  # the worker saw its lifeline break and stopped
    go.touch()  # an orphaned worker would now finish test_slow and go on writing records
    time.sleep(0.5)
    kept = {r["case"] for r in results.cases(out / "results.jsonl")}
    assert kept == {"test_parent.py::test_a", "test_parent.py::test_b"}

    # out of the worker's group, it stays when the kernel's parent-death signal ends the
    # worker first (the worker ends it when its lifeline's thread gets there first)
    left = int(pid_file.read_text())
    try:
        resumed = run(tmp_path, "--resume", str(out), env=env)
        if probe is not None:  # the resumed run ended what the dead run's cgroup held
            wait_for(lambda: dead(left), timeout=10)
    finally:
        with contextlib.suppress(OSError):
            os.kill(left, signal.SIGKILL)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    recs = assert_kept(out)
    # a plan per worker: the first, and the resumed one's (what it had left)
    kinds = Counter(r["record"] for r in recs)
    assert kinds == {"run": 1, "resume": 1, "plan": 2, "case": 5, "end": 1}
    assert {k: r["status"] for k, r in by_case(out).items()} == dict.fromkeys(
        ("test_a", "test_b", "test_slow", "test_c", "test_d"), "passed"
    )
    assert (out / "report.html").exists()


# --- the output disk full, the folder made read-only ----------------------------------------

MANY = {
    "test_many.py": """
    import os, time, pytest
    @pytest.mark.parametrize("i", range(40))
    def test_many(i):
        go = os.environ.get("FAULT_GO")
        if go and i == 3:  # the fault is made while this case runs
            open(go + ".inside", "w").close()
            while not os.path.exists(go):
                time.sleep(0.05)
"""
}


def assert_stopped_on_output_fault(
    proc: subprocess.CompletedProcess[str], out: Path, torn: int = 0
) -> list[int]:
    """One line, exit 2; the records before the fault kept and whole, in order; no worker left;
    the numbers of the cases recorded."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    said = [line for line in proc.stderr.splitlines() if line.startswith("gpucheck: ")]
    assert len(said) == 1 and "cannot write" in said[0] and "--resume" in said[0], proc.stderr
    recs = assert_kept(out, torn)
    assert recs[0]["record"] == "run"
    cases = [r for r in recs if r["record"] == "case"]
    done = [int(r["case"].split("[")[1].rstrip("]")) for r in cases]
    assert done == list(range(len(done))) and len(done) < 40
    # the cases before the fault passed; the one under way is not recorded, or, where the
    # worker's own log is on the full disk and it died writing it, recorded as crashed
    assert all(r["status"] == "passed" for r in cases[:-1])
    assert cases[-1]["status"] in ("passed", "crashed")
    for state in (out / "workers").glob("*.state.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            assert dead(int(json.loads(state.read_text())["pid"]))
    return done


def assert_report_and_resume(tmp_path: Path, out: Path, done: list[int]) -> None:
    """Once the fault is gone: the report renders and counts as passed only the cases that
    ran; --resume runs the rest, each case recorded once."""
    page = tmp_path / "page.html"
    rep = report(out, page)
    assert rep.returncode != 0, rep.stdout  # not "passed": the run did not finish
    assert page.exists()
    resumed = run(tmp_path, "--resume", str(out))
    recs = by_case(out)
    assert len(recs) == 40
    crashed = [k for k, r in recs.items() if r["status"] != "passed"]
    assert resumed.returncode == (1 if crashed else 0), resumed.stdout + resumed.stderr
    assert crashed in ([], [f"test_many[{done[-1]}]"])  # the one under way, at most


def test_a_file_size_limit_on_results_stops_the_run_in_one_line(tmp_path):
    """RLIMIT_FSIZE (the kernel's EFBIG, on every machine and user): results.jsonl cannot grow
    past a few records; the report pages, larger, cannot be written either."""
    make_suite(tmp_path, "demo", MANY)
    out = tmp_path / "out"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (9000, 9000))

    proc = run(tmp_path, "--out", str(out), preexec_fn=limit)
    assert "File too large" in proc.stderr
    done = assert_stopped_on_output_fault(proc, out)  # the cut line taken back
    assert done  # some records were written before the limit
    assert_report_and_resume(tmp_path, out, done)


def _can_mount_tmpfs(where: Path) -> bool:
    where.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "gpucheck-test", str(where)],
        capture_output=True,
    )
    return made.returncode == 0


def _drop_dac_override() -> None:
    """As root: lose CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH for the run, so that file
    permissions apply to it."""
    drop_capabilities(1, 2)


@pytest.mark.parametrize(
    "worker_said",
    [
        # the worker's state file failed first (its line has no hint): the race the disk-full
        # test lost now and then under -n 2
        "gpucheck: cannot write {out}/workers/cpu.blocking.state.json: No space left on device",
        # a record failed first (the record writer's line, hint included)
        "gpucheck: cannot write {out}/results.jsonl: No space left on device; the run stopped "
        "here, every record written before is kept (make room or make the folder writable, then "
        "`gpucheck run --resume {out}`)",
        "",  # the worker's log is on the full disk too: it could say nothing
    ],
)
def test_the_output_fault_line_always_says_how_to_finish_the_run(tmp_path, worker_said):
    from gpucheck.controller.deaths import output_fault

    out = tmp_path / "out"
    line = output_fault(f"some output\n{worker_said.format(out=out)}\n", out, "cpu blocking")
    assert line.startswith("cannot write ")
    assert line.count(f"`gpucheck run --resume {out}`") == 1
    assert "every record written before is kept" in line


@pytest.mark.parametrize("fault", ["disk-full", "read-only"])
def test_the_output_folder_failing_mid_run_stops_the_run_in_one_line(tmp_path, fault):
    """disk-full: a real tmpfs of 512 KiB, filled by this test while a case runs (ENOSPC);
    needs the right to mount (root here; the EFBIG test above covers a full disk everywhere).
    read-only: the folder and results.jsonl made read-only with chmod while a case runs
    (EACCES); as root, the run is started without CAP_DAC_OVERRIDE so permissions hold."""
    mnt = tmp_path / "mnt"
    mounted = False
    if fault == "disk-full":
        mounted = _can_mount_tmpfs(mnt)
        if not mounted:
            pytest.skip("cannot mount a tmpfs here; the RLIMIT_FSIZE test covers a full disk")
    else:
        mnt.mkdir()
    try:
        make_suite(tmp_path, "demo", MANY)
        out, go = mnt / "out", tmp_path / "go"
        proc = start(
            tmp_path,
            "--out",
            str(out),
            env={"FAULT_GO": str(go)},
            preexec_fn=_drop_dac_override if os.geteuid() == 0 else None,
        )
        wait_for(Path(str(go) + ".inside").exists)
        if fault == "disk-full":
            with contextlib.suppress(OSError), open(mnt / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        else:
            (out / "results.jsonl").chmod(0o444)
            out.chmod(0o555)
        go.touch()
        stdout, stderr = proc.communicate(timeout=60)
        said = "No space left on device" if fault == "disk-full" else "Permission denied"
        assert said in stderr
        done = assert_stopped_on_output_fault(
            subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), out
        )
        # the fault came while case 3 ran; on the full tmpfs, a few records more may fit in
        # the page results.jsonl's last line left partly free
        assert done[:3] == [0, 1, 2] and len(done) < 12, done
        if fault == "disk-full":
            (mnt / "filler").unlink()
        else:
            out.chmod(0o755)
            (out / "results.jsonl").chmod(0o644)
        assert_report_and_resume(tmp_path, out, done)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


# --- a worker printing gigabytes --------------------------------------------------------------


def test_a_case_flooding_its_output_leaves_bounded_logs_and_the_run_completes(tmp_path):
    """The case writes 48 MiB (3x LOG_CAP, however slow the machine) to fd 1 and 2 in a tight
    loop, as native code does, past pytest's capture: the harness cuts each log to LOG_CAP while
    it runs (this machine's disk never holds much more), keeping its head and its tail."""
    make_suite(
        tmp_path,
        "demo",
        {
            "test_flood.py": """
        import os, time
        def test_flood():
            chunk = b"y" * (1 << 20)
            for fd in (1, 2):
                os.write(fd, b"FLOOD-START\\\\n")
            written, t0 = 0, time.monotonic()
            while written < 48 << 20 and time.monotonic() - t0 < 30:
                os.write(1, chunk)
                os.write(2, chunk)
                written += len(chunk)
            for fd in (1, 2):
                os.write(fd, b"\\\\nFLOOD-END\\\\n")
            with open(os.environ["FAULT_WRITTEN"], "w") as f:
                f.write(str(written))
        def test_after():
            pass
    """
        },
    )
    out, written = tmp_path / "out", tmp_path / "written"
    t0 = time.monotonic()
    proc = run(tmp_path, "--out", str(out), env={"FAULT_WRITTEN": str(written)})
    assert time.monotonic() - t0 < 90
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {k: r["status"] for k, r in by_case(out).items()} == {
        "test_flood": "passed",
        "test_after": "passed",
    }
    for name in ("cpu.blocking.out.log", "cpu.blocking.err.log"):
        log = out / "workers" / name
        assert log.stat().st_size <= LOG_CAP, name
        with open(log, "rb") as f:
            head = f.read(1 << 16)
            f.seek(-(1 << 16), os.SEEK_END)
            end = f.read()
        assert b"FLOOD-START" in head and b"FLOOD-END" in end, name
        # one cut line, however often the log was cut, saying how much was cut in all: what
        # the case wrote less what the log kept (give or take what a cut races with)
        data = log.read_bytes()
        (cut,) = re.findall(rb"\[gpucheck: (\d+) bytes of output cut here", data)
        line = data.index(b"\n[gpucheck: ")
        kept = len(data) - (data.index(b"]\n", line) + 2 - line)
        wrote = int(written.read_text()) + len(b"FLOOD-START\n\nFLOOD-END\n")
        assert abs(int(cut) + kept - wrote) <= LOG_KEEP, (name, int(cut), kept, wrote)
        assert int(cut) > LOG_CAP  # cut more than once: the first cut's count alone is less
    assert (out / "report.html").exists()


# --- a case that forks or calls os._exit(0) -------------------------------------------------


def test_os_exit_0_mid_case_is_a_crash_not_a_pass(tmp_path):
    make_suite(
        tmp_path,
        "demo",
        {
            "test_exit.py": """
        import os
        def test_before():
            pass
        def test_exits():
            os._exit(0)
        def test_after():
            pass
    """
        },
    )
    out = tmp_path / "out"
    proc = run(tmp_path, "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = by_case(out)
    assert {k: r["status"] for k, r in recs.items()} == {
        "test_before": "passed",
        "test_exits": "crashed",
        "test_after": "passed",
    }
    assert "exited with code 0" in recs["test_exits"]["reason"]
    assert "does not count as passed" in recs["test_exits"]["findings"][0]["hint"]
    assert "2 passed" in proc.stdout.strip().splitlines()[-1]
    assert_kept(out)


def test_a_forked_child_neither_records_twice_nor_outlives_the_run(tmp_path):
    """os.fork() whose child returns into pytest (it would run every later case again and
    write their records), and a subprocess the case leaves running (a warning: not one a
    module fixture started before the body, which outlives the case too)."""
    make_suite(
        tmp_path,
        "demo",
        {
            "test_fork.py": """
        import os, subprocess, sys, time
        def test_forks():
            if os.fork() != 0:
                time.sleep(0.3)
        def test_leaves_a_process():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            with open(os.environ["FAULT_PID"], "w") as f:
                f.write(str(child.pid))
        def test_after():
            pass
    """,
            # a process a fixture started before the body (and ends after it) is not the case's
            "test_served.py": """
        import subprocess, sys, pytest
        @pytest.fixture(scope="module")
        def server():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            yield child
            child.kill()
            child.wait()
        def test_served(server):
            assert server.poll() is None
        def test_served_again(server):
            assert server.poll() is None
    """,
        },
    )
    out, pid_file = tmp_path / "out", tmp_path / "pid"
    proc = run(tmp_path, "--out", str(out), env={"FAULT_PID": str(pid_file)})
    time.sleep(0.5)
    recs = by_case(out)  # each case exactly once: the fork wrote nothing
    assert {k: r["status"] for k, r in recs.items()} == dict.fromkeys(
        ("test_forks", "test_leaves_a_process", "test_after", "test_served", "test_served_again"),
        "passed",
    )
    left = int(pid_file.read_text())
    strays = {
        k: [f for f in r["findings"] if f["kind"] == "stray-process"] for k, r in recs.items()
    }
    assert [k for k, found in strays.items() if found] == ["test_leaves_a_process"]
    (stray,) = strays["test_leaves_a_process"]
    assert stray["severity"] == "warning" and f"pid {left}" in stray["message"]
    wait_for(lambda: dead(left), timeout=10)  # ended with its worker
    assert proc.returncode == 0, proc.stdout + proc.stderr  # warnings only
    assert_kept(out)


#: processes that leave the worker's process group: a session of their own
#: (start_new_session=True; a fork that calls os.setsid()), a daemon's double fork (its
#: grandchild orphaned), a child of a case that then hangs, and one of a case that then dies
SESSIONS = {
    "test_sessions.py": """
    import os, signal, subprocess, time
    from pathlib import Path
    DIR = Path(os.environ["FAULT_DIR"])

    def note(name, pid):
        (DIR / name).write_text(str(pid))

    def test_new_session():
        note("new-session", subprocess.Popen(["sleep", "301"], start_new_session=True).pid)

    def test_fork_setsid():
        pid = os.fork()
        if pid == 0:
            os.setsid()
            time.sleep(301)
            os._exit(0)
        note("fork-setsid", pid)

    def test_daemon():
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                note("daemon", os.getpid())
                time.sleep(301)
            os._exit(0)
        os.waitpid(pid, 0)
        while not (DIR / "daemon").exists():
            time.sleep(0.01)

    def test_hangs_after_a_child():
        note("hang", subprocess.Popen(["sleep", "301"], start_new_session=True).pid)
        time.sleep(60)

    def test_dies_after_a_child():
        note("crash", subprocess.Popen(["sleep", "301"], start_new_session=True).pid)
        os.kill(os.getpid(), signal.SIGKILL)
"""
}


@pytest.mark.parametrize("tracked_by", ["cgroup", "children"])
def test_processes_in_sessions_of_their_own_do_not_outlive_the_run(tmp_path, tracked_by):
    """Nothing a case starts outlives the run, outside the worker's process group too: with a
    cgroup per worker (where one can be made: here, as root), every process of it; without
    (``GPUCHECK_NO_CGROUP=1``), the worker's children as it recorded them at each case's end,
    and its descendants as the controller saw them before it killed a hung worker (the child
    of a case that kills its worker is then out of reach: that case runs with a cgroup only)."""
    from gpucheck.processes import Cgroup

    if tracked_by == "cgroup":
        probe = Cgroup.make("probe")
        if probe is None:
            pytest.skip("no cgroup can be made here: the 'children' case covers this machine")
        probe.kill()
    make_suite(tmp_path, "demo", SESSIONS)
    out, pids = tmp_path / "out", tmp_path / "pids"
    pids.mkdir()
    env = {"FAULT_DIR": str(pids), "GPUCHECK_NO_CGROUP": "1" if tracked_by == "children" else "0"}
    only = ["--", "-k", "not dies_after"] if tracked_by == "children" else []
    proc = run(tmp_path, "--out", str(out), "--timeout", "3", *only, env=env)
    started = {p.name: int(p.read_text()) for p in pids.iterdir()}
    alive = [name for name, pid in started.items() if not dead(pid)]
    for pid in started.values():  # whatever the outcome, leave nothing on the machine
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    want = {"new-session", "fork-setsid", "daemon", "hang"}
    assert set(started) == want | ({"crash"} if tracked_by == "cgroup" else set())
    assert not alive, (alive, proc.stdout)  # none outlived gpucheck run
    recs = by_case(out)
    assert recs["test_hangs_after_a_child"]["status"] == "hung"
    for case, name in (("test_new_session", "new-session"), ("test_fork_setsid", "fork-setsid")):
        (stray,) = [f for f in recs[case]["findings"] if f["kind"] == "stray-process"]
        assert f"pid {started[name]}" in stray["message"]
    # each ended and named in the run's notes
    said = " ".join(line for line in proc.stdout.splitlines() if "its cases left running" in line)
    for name in want:
        assert f"pid {started[name]} " in said, (name, proc.stdout)


# --- a case that changes CUDA_VISIBLE_DEVICES or the working folder -------------------------


def test_chdir_and_cuda_visible_devices_changes_are_put_back_and_are_findings(tmp_path):
    make_suite(
        tmp_path,
        "demo",
        {
            "test_state.py": """
        import os, tempfile
        START = os.getcwd()
        def test_chdir():
            os.chdir(tempfile.gettempdir())
        def test_env():
            os.environ["CUDA_VISIBLE_DEVICES"] = "7"
        def test_after():
            assert os.getcwd() == START
            assert os.environ["CUDA_VISIBLE_DEVICES"] == ""  # what --cpu-only set
    """
        },
    )
    proc = run(tmp_path, "--out", "out")  # relative: the records still land in it
    out = tmp_path / "out"
    recs = by_case(out)
    assert {k: r["status"] for k, r in recs.items()} == dict.fromkeys(
        ("test_chdir", "test_env", "test_after"), "passed"
    )
    (moved,) = recs["test_chdir"]["findings"]
    assert moved["kind"] == "process-state" and "working folder" in moved["message"]
    (env,) = recs["test_env"]["findings"]
    assert "CUDA_VISIBLE_DEVICES from '' to '7'" in env["message"]
    assert proc.returncode == 0, proc.stdout + proc.stderr  # warnings
    assert "warnings" in proc.stdout.strip().splitlines()[-1]


# --- a syntax or import error in one suite among several ------------------------------------


def test_a_collection_error_costs_only_its_file(tmp_path):
    """The GPU run's bug: a missing import in one suite made the worker exit 2 before any case
    of any suite ran."""
    make_suite(tmp_path, "alpha", {"test_alpha.py": "def test_a1():\n    pass\n"})
    make_suite(
        tmp_path,
        "broken",
        {
            "test_import.py": "import not_a_module_xyz\n\ndef test_never():\n    pass\n",
            "test_syntax.py": "def test_never(:\n    pass\n",
            "test_fine.py": "def test_fine():\n    pass\n",
        },
    )
    make_suite(tmp_path, "gamma", {"test_gamma.py": "def test_g1():\n    pass\n"})
    out = tmp_path / "out"
    proc = run(
        tmp_path,
        "--out",
        str(out),
        "--suite",
        "suites/alpha",
        "--suite",
        "suites/broken",
        "--suite",
        "suites/gamma",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = results.cases(out / "results.jsonl")
    status = {(r["suite"], r["case"]): r["status"] for r in recs}
    assert status == {
        ("alpha", "test_alpha.py::test_a1"): "passed",
        ("gamma", "test_gamma.py::test_g1"): "passed",
        ("broken", "test_fine.py::test_fine"): "passed",
        ("broken", "test_import.py"): "error",
        ("broken", "test_syntax.py"): "error",
    }
    errors = {r["case"]: r["findings"][0] for r in recs if r["status"] == "error"}
    assert errors["test_import.py"]["kind"] == "collection-error"
    assert "No module named 'not_a_module_xyz'" in errors["test_import.py"]["message"]
    assert "SyntaxError" in errors["test_syntax.py"]["message"]
    assert "test_import.py" in (out / "report.html").read_text()
    assert_kept(out)


# --- a fixture that raises in teardown after a finding --------------------------------------


def test_a_teardown_error_after_a_finding_keeps_both(tmp_path):
    make_suite(
        tmp_path,
        "demo",
        {
            "test_teardown.py": """
        import pytest
        @pytest.fixture
        def breaks():
            yield
            raise RuntimeError("teardown exploded")
        def test_fails(breaks):
            assert [1] == [2]
        def test_attaches(breaks, gpucheck_findings):
            gpucheck_findings.attach("demo-finding", "found something", severity="warning")
        def test_after():
            pass
    """
        },
    )
    out = tmp_path / "out"
    proc = run(tmp_path, "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = by_case(out)
    assert recs["test_after"]["status"] == "passed"
    for name, first in (("test_fails", "assert [1] == [2]"), ("test_attaches", "found something")):
        rec = recs[name]
        assert rec["status"] == "error", name
        messages = [f["message"] for f in rec["findings"]]
        assert any(first in m for m in messages), messages
        assert any("teardown exploded" in m and m.endswith("(in teardown)") for m in messages)
    assert_kept(out)


def test_the_lifeline_is_only_the_controllers_pipe(tmp_path, monkeypatch):
    """A worker trusts its lifeline only when the descriptor is still the controller's pipe
    (same inode): a tool in between (compute-sanitizer) may close it, and the number may then
    name another file, whose end would otherwise read as the controller's death."""
    from gpucheck.model.contract import LIFELINE_FD_ENV
    from gpucheck.worker import guard

    r, w = os.pipe()
    other = open(tmp_path / "other", "wb+")  # noqa: SIM115
    try:
        closed = os.dup(r)
        os.close(closed)
        for value in (
            "",
            "7",
            "x:1",
            f"{other.fileno()}:{os.fstat(other.fileno()).st_ino}",
            f"{r}:{os.fstat(r).st_ino + 1}",
            f"{closed}:{os.fstat(r).st_ino}",
        ):
            monkeypatch.setenv(LIFELINE_FD_ENV, value)
            assert guard.watch_controller() is False, value
            assert LIFELINE_FD_ENV not in os.environ  # never passed on to a case's children
    finally:
        other.close()
        os.close(r)
        os.close(w)
