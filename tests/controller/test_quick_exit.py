"""A harness worker ends without the interpreter's teardown once pytest is done
(gpucheck.worker.quick_exit), after what a normal exit runs first: the threads that are not
daemons, the atexit handlers; its exit code is pytest's."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from workerkit import run_cpu_worker

from gpucheck.controller.prestart import QUICK_EXIT
from gpucheck.controller.spawning import WorkerSpec, worker_command

SUITE = """
import atexit, os, sys, threading, time
from pathlib import Path

OUT = Path(os.environ["QUICK_EXIT_OUT"])


class Teardown:
    def __init__(self):
        # what __del__ needs, kept here: the module's globals are gone by then
        self.path, self.open, self.write = str(OUT / "teardown"), os.open, os.write
        self.flags = os.O_WRONLY | os.O_CREAT

    def __del__(self):  # runs only in the interpreter's teardown
        self.write(self.open(self.path, self.flags), b"ran")


KEPT = Teardown()


def _late():
    time.sleep(0.5)
    (OUT / "thread").write_text("joined")


def test_leaves_a_thread_and_an_exit_handler():
    atexit.register(lambda: (OUT / "atexit").write_text("ran"))
    threading.Thread(target=_late).start()  # not a daemon: a normal exit waits for it


def test_fails():
    assert False


def test_the_current_folder_is_on_the_path_as_under_python_m():
    (OUT / "path").write_text(repr(("" in sys.path, os.getcwd() in sys.path)))
"""


def _run(tmp_path: Path, monkeypatch) -> tuple[list[dict], Path, list[str], int | None]:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_end.py").write_text(SUITE)
    seen = tmp_path / "seen"
    seen.mkdir()
    monkeypatch.setenv("QUICK_EXIT_OUT", str(seen))
    records, harness = run_cpu_worker(suite, tmp_path / "out")
    cmd = shlex.split(next((tmp_path / "out" / "workers").glob("*.cmd")).read_text())
    return records, seen, cmd, harness.workers[0].proc.returncode


def test_the_worker_ends_after_its_threads_and_exit_handlers_without_teardown(
    tmp_path, monkeypatch
):
    records, seen, cmd, code = _run(tmp_path, monkeypatch)
    assert cmd[cmd.index(sys.executable) + 1 :][:2] == ["-c", QUICK_EXIT]
    status = {r["case"]: r["status"] for r in records if r["record"] == "case"}
    assert status == {
        "test_end.py::test_leaves_a_thread_and_an_exit_handler": "passed",
        "test_end.py::test_fails": "failed",
        "test_end.py::test_the_current_folder_is_on_the_path_as_under_python_m": "passed",
    }
    assert (seen / "path").read_text() == repr((False, True))
    assert (seen / "thread").read_text() == "joined"
    assert (seen / "atexit").read_text() == "ran"
    assert not (seen / "teardown").exists()  # the interpreter's teardown did not run
    assert code == 1  # pytest's: a test failed


def test_worker_command_without_quick_exit_is_plain_pytest(tmp_path):
    spec = WorkerSpec("cpu", None, None, {"s": tmp_path}, "blocking")
    plain = worker_command(spec, tmp_path / "r.jsonl", tmp_path / "s.json", "r1")
    quick = worker_command(spec, tmp_path / "r.jsonl", tmp_path / "s.json", "r1", quick_exit=True)
    assert plain[1:3] == ["-m", "pytest"]
    assert quick[1:3] == ["-c", QUICK_EXIT]
    assert plain[3:] == quick[3:]


def test_an_executor_left_open_does_not_keep_the_worker_alive():
    """A ``ThreadPoolExecutor`` a test never shut down: its idle thread is not a daemon and
    ends only when ``threading``'s own exit hook tells it to (joining it alone waits forever)."""
    code = (
        "import concurrent.futures as f; pool = f.ThreadPoolExecutor(1); "
        "pool.submit(print, 'ran').result(); "
        "from gpucheck.worker.quick_exit import end; end(3)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (3, "ran\n")
