"""What the fault-injection tests (tests/controller/test_faults.py and
tests/controller/test_faults_env.py) share: a suite written on the fly, `gpucheck run`
started as a real process, the waits, and the checks that every record kept is whole and
every case recorded once."""

from __future__ import annotations

import contextlib
import ctypes
import json
import subprocess
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO

import clirun
import jsonschema

from gpucheck.model import results


def make_suite(project: Path, name: str, files: dict[str, str]) -> Path:
    folder = project / "suites" / name
    folder.mkdir(parents=True, exist_ok=True)
    for fname, text in files.items():
        (folder / fname).write_text(textwrap.dedent(text))
    return folder


def start(
    project: Path,
    *args: str,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    cpu: bool = True,
    stderr: int | IO[str] = subprocess.PIPE,
) -> subprocess.Popen[str]:
    """`gpucheck run --quiet` in ``project`` (``--cpu-only`` unless ``cpu`` is False or it
    resumes: a resumed run keeps its settings); ``env`` over this process's environment."""
    only = ["--cpu-only"] if cpu and "--resume" not in args else []
    return clirun.start(
        "run", "--quiet", *only, *args, cwd=project, env=env, stderr=stderr, preexec_fn=preexec_fn
    )


def run(
    project: Path,
    *args: str,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    cpu: bool = True,
) -> subprocess.CompletedProcess[str]:
    proc = start(project, *args, env=env, preexec_fn=preexec_fn, cpu=cpu)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def wait_for(what: Callable[[], object], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if what():
                return
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def in_case(out: Path, name: str) -> Callable[[], bool]:
    state = out / "workers" / "cpu.blocking.state.json"
    return lambda: f"::{name}" in state.read_text()


def worker_pid(out: Path) -> int:
    return int(json.loads((out / "workers" / "cpu.blocking.state.json").read_text())["pid"])


def by_case(out: Path) -> dict[str, dict]:
    recs = results.cases(out / "results.jsonl")
    names = Counter(r["case"] for r in recs)
    assert all(n == 1 for n in names.values()), names  # every case recorded exactly once
    return {r["case"].rsplit("::", 1)[-1]: r for r in recs}


def assert_kept(out: Path, torn_allowed: int = 0) -> list[dict]:
    """Every line of results.jsonl is a valid record (``torn_allowed``: a last line the fault
    cut short)."""
    recs, torn = results.read_lines(out / "results.jsonl")
    assert torn <= torn_allowed
    schema = results.schema()
    for rec in recs:
        jsonschema.validate(rec, schema)
    return recs


def dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def report(out: Path, html: Path) -> subprocess.CompletedProcess[str]:
    """`gpucheck report` of the run folder, its page written elsewhere."""
    return clirun.gpucheck("report", str(out), "-o", str(html), timeout=120)


def drop_capabilities(*caps: int) -> None:
    """As root: lose ``caps`` (numbers of linux/capability.h) for the process about to be run
    (the bounding set; exec then leaves them out), so that what they bypass applies to it."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in caps:
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")
