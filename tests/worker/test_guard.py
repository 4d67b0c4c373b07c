"""What a case may leave behind in its worker: the processes it started (the stray-process
warning reads them twice a case, so the read is cheap: each thread's children list)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from gpucheck import processes
from gpucheck.worker import guard

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _exec_done(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """``proc`` once its command line can be read: a child just forked under load can show an
    empty one for a moment, mid-exec (the lists compared here name the command)."""
    deadline = time.monotonic() + 10
    while not processes.cmdline(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


@pytest.fixture
def children():
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_live_children_lists_running_children_with_their_command_line(children):
    children.append(_exec_done(subprocess.Popen(SLEEPER)))
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()  # reaped: gone
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    children.append(zombie)
    while True:  # ended but not reaped: a zombie, not running
        with open(f"/proc/{zombie.pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                break
    found = guard.live_children()
    assert set(found) == {children[0].pid}
    assert found[children[0].pid] == " ".join(SLEEPER)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_child_another_thread_started_is_listed_too(children):
    """A child is listed under the thread that started it (and moves to another thread of
    the process when that one ends)."""
    t = threading.Thread(target=lambda: children.append(subprocess.Popen(SLEEPER)))
    t.start()
    t.join()
    assert set(guard.live_children()) == {children[0].pid}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_without_children_lists_every_process_of_proc_is_scanned(children, monkeypatch):
    """A kernel without the children lists: the scan of /proc finds the same children."""
    children.append(_exec_done(subprocess.Popen(SLEEPER)))
    listed = guard.live_children()
    real_open = open

    def no_lists(path, *args, **kwargs):
        if str(path).endswith("/children"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_lists)
    assert guard.live_children() == listed == {children[0].pid: " ".join(SLEEPER)}
