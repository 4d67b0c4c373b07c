"""Sanitizer passes on CPU: a stand-in compute-sanitizer runs the worker as its child (as the
real tool does) and the cases append *real recorded* log text to a per-pid log, as the tool
does while a kernel runs. Checks attribution of records to the case that was
running, and the sweep of records no case claimed (after the last case, child processes)."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpucheck.controller.harness import Harness, WorkerSpec
from gpucheck.model import results

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sanitizer"

FAKE_TOOL = textwrap.dedent("""\
    #!/usr/bin/env bash
    # stand-in for compute-sanitizer: note the log template, run the worker as a child
    while [ $# -gt 0 ]; do
      case "$1" in
        --log-file) export FAKE_SAN_LOG="$2"; shift 2 ;;
        --tool|--error-exitcode|--target-processes|--print-limit) shift 2 ;;
        *) break ;;
      esac
    done
    "$@"
    exit $?
""")

SUITE = textwrap.dedent("""
    import os, subprocess, sys, pytest
    FIX = os.environ["FIXTURES"]

    def write(name, pid=None):
        log = os.environ["FAKE_SAN_LOG"].replace("%p", str(pid or os.getpid()))
        with open(log, "a") as f, open(os.path.join(FIX, name)) as src:
            f.write(src.read())

    @pytest.mark.sanitizer
    def test_clean():
        assert True

    @pytest.mark.sanitizer
    def test_out_of_bounds():
        write("memcheck_oob_planted_h200.log")

    @pytest.mark.sanitizer
    def test_child_process():
        code = "import os,sys; sys.path.insert(0, os.environ['HERE']); import test_san as t; " \\
               "t.write('memcheck_api_planted_h200.log', os.getpid())"
        subprocess.run([sys.executable, "-c", code], check=True,
                       env={**os.environ, "HERE": os.path.dirname(__file__)})

    @pytest.mark.sanitizer
    def test_killed_by_the_tool():
        write("racecheck_race_planted_h200.log")  # the tool reports, then ends the process
        os.abort()

    @pytest.mark.sanitizer
    def test_hang():
        if os.environ.get("DEMO_HANG"):
            import time
            time.sleep(600)

    @pytest.mark.sanitizer(tools=("racecheck",))
    def test_racecheck_only():
        write("racecheck_race_planted_h200.log")

    @pytest.mark.sanitizer
    def test_last():
        assert True

    def test_not_small_enough_for_the_sanitizer():
        write("memcheck_oob_planted_h200.log")
""")


@pytest.fixture
def setup(tmp_path, monkeypatch):
    if not shutil.which("bash"):
        pytest.skip("needs bash")
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(FAKE_TOOL)
    tool.chmod(0o755)
    suite = tmp_path / "suites" / "san"
    suite.mkdir(parents=True)
    (suite / "test_san.py").write_text(SUITE)
    monkeypatch.setenv("FIXTURES", str(FIXTURES))
    return tool, suite


def _run(
    tmp_path: Path, suites: dict[str, Path], name: str, tool: Path, timeout: float, **spec: Any
) -> Path:
    """One worker on CPU under the stand-in ``tool`` in a pass of the sanitizer tool ``name``;
    its run folder (``tmp_path/out``)."""
    out = tmp_path / "out"
    out.mkdir()
    worker = WorkerSpec(
        "cpu", None, None, suites, f"sanitizer:{name}", sanitizer_tool=name, sanitizer=tool, **spec
    )
    Harness([worker], out, out / "results.jsonl", "r1", timeout=timeout).run()
    return out


def _cases(out: Path) -> dict[str, dict[str, Any]]:
    """The case records of a run folder by test name."""
    return {r["case"].rsplit("::", 1)[-1]: r for r in results.cases(out / "results.jsonl")}


def test_sanitizer_records_are_attributed_to_their_case(setup, tmp_path):
    tool, suite = setup
    recs = _cases(_run(tmp_path, {"san": suite}, "memcheck", tool, 60))
    # only the cases marked `sanitizer` ran
    assert "test_not_small_enough_for_the_sanitizer" not in recs
    assert "test_racecheck_only" not in recs  # marked for another tool's pass
    assert recs["test_clean"]["status"] == "passed" and recs["test_clean"]["findings"] == []
    oob = recs["test_out_of_bounds"]
    assert oob["status"] == "failed"
    assert oob["reason"].startswith("compute-sanitizer: Invalid __global__ write of size 4")
    (f,) = oob["findings"]
    assert f["kind"] == "sanitizer" and f["kernel"] == "oob_write"
    assert "x20 in oob_write planted.cu:9" in f["message"]
    # a child process of a case writes its own log (%p): its records belong to that case
    child = recs["test_child_process"]
    assert child["status"] == "failed"
    assert "cudaMemcpy" in child["findings"][0]["message"]
    # a worker the tool ended inside a case: a crashed record that carries the tool's records,
    # then a fresh worker for the rest
    killed = recs["test_killed_by_the_tool"]
    assert killed["status"] == "crashed"
    kinds = [f["kind"] for f in killed["findings"]]
    assert kinds == ["sanitizer", "crash"]
    assert "Race reported between Write access" in killed["findings"][0]["message"]
    assert recs["test_last"]["status"] == "passed"
    assert not [k for k in recs if k.startswith("<")]  # nothing left unattributed


CRASH_SUITE = textwrap.dedent("""
    import gzip, os, pytest, torch
    LIB = torch.library.Library("gpucheck_crash_test", "DEF")
    LIB.define("overrun(Tensor x) -> Tensor")

    @torch.library.impl(LIB, "overrun", "CPU")
    def _overrun(x):
        out = torch.empty_like(x)
        with gzip.open(os.path.join(os.environ["FIXTURES"], LOG), "rt") as f:
            text = f.read()
        # the record's nearest allocation moved onto this output, its line onto the case's
        text = text.replace("0x7f9539002000", hex(out.untyped_storage().data_ptr()))
        text = text.replace("test_unwritten_gpu.py:76", f"test_crash.py:{LINE}")
        with open(os.environ["FAKE_SAN_LOG"].replace("%p", str(os.getpid())), "a") as f:
            f.write(text)
        os.abort()  # as on the GPU: a failed launch, a free in a C++ destructor, the end

    @pytest.mark.sanitizer
    def test_overrun():
        torch.ops.gpucheck_crash_test.overrun(torch.rand(1000))

    @pytest.mark.sanitizer
    def test_after():
        assert True
""")


def test_an_overrun_that_kills_the_worker_is_out_of_bounds_of_the_call_under_way(setup, tmp_path):
    """On an H100 memcheck's invalid write in test_7_overrun ended the worker inside the call:
    a crash and plain records, no out-of-bounds. The recorded log, written by a real call that
    then dies: the controller traces it to the call the worker had under way."""
    tool, _ = setup
    suite = tmp_path / "suites" / "crash"
    suite.mkdir(parents=True)
    line = CRASH_SUITE.splitlines().index(
        "    torch.ops.gpucheck_crash_test.overrun(torch.rand(1000))"
    )
    text = CRASH_SUITE.replace("LOG)", '"memcheck_overrun_crash_h100.log.gz")')
    (suite / "test_crash.py").write_text(text.replace("{LINE}", str(line + 1)))
    recs = _cases(_run(tmp_path, {"crash": suite}, "memcheck", tool, 120))
    crashed = recs["test_overrun"]
    assert crashed["status"] == "crashed"
    kinds = [f["kind"] for f in crashed["findings"]]
    assert kinds[0] == "out-of-bounds" and kinds[-1] == "crash" and "sanitizer" in kinds
    oob = crashed["findings"][0]
    assert (oob["op"], oob["kernel"]) == ("gpucheck_crash_test::overrun", "overrun_kernel")
    assert oob["message"].startswith(
        "`gpucheck_crash_test::overrun` launched overrun_kernel, which made 1 invalid global "
        "write(s): 1 bytes after a tensor gpucheck_crash_test::overrun allocated while it ran "
        "(shape [1000], float32) (called from "
    )
    assert f"test_crash.py:{line + 1} in test_overrun" in oob["message"]
    assert recs["test_after"]["status"] == "passed"


def test_worker_command_under_the_sanitizer(setup, tmp_path):
    from gpucheck.controller.spawning import worker_command

    tool, suite = setup
    spec = WorkerSpec(
        "cuda:1",
        1,
        "GPU-x",
        {"san": suite},
        "sanitizer:racecheck",
        sanitizer_tool="racecheck",
        sanitizer=tool,
    )
    cmd = worker_command(
        spec,
        tmp_path / "r.jsonl",
        tmp_path / "s.json",
        "r1",
        None,
        tmp_path / "w.sanitizer.%p.log",
        quick_exit=True,  # asked for, and refused: the tool's leak report needs the teardown
    )
    assert cmd[:4] == [str(tool), "--tool", "racecheck", "--log-file"]
    assert cmd[cmd.index("--error-exitcode") + 1] == "86"
    assert cmd[cmd.index(sys.executable) + 1 :][:2] == ["-m", "pytest"]
    assert cmd[cmd.index("-m", cmd.index("pytest")) + 1] == "sanitizer"


def test_hang_under_the_sanitizer_dumps_the_workers_stacks(setup, tmp_path, monkeypatch):
    """The tool is the worker's parent: the stack request must reach the Python worker."""
    tool, suite = setup
    monkeypatch.setenv("DEMO_HANG", "1")
    pytest_args = ["-k", "test_hang or test_last"]
    out = _run(tmp_path, {"san": suite}, "memcheck", tool, 3, pytest_args=pytest_args)
    recs = _cases(out)
    hung = recs["test_hang"]
    assert hung["status"] == "hung"
    assert "in test_hang" in hung["findings"][-1]["evidence"]
    assert recs["test_last"]["status"] == "passed"


# -- the print budget is per case --------------------------------------------------------

#: a stand-in that, like compute-sanitizer, writes its summary into each log when the worker
#: ends: the records printed, and those it counted but did not print (a case says how many in
#: a file of $DROPPED named after its pid)
COUNTING_TOOL = f"""#!{sys.executable}
import glob, os, subprocess, sys
args, env = sys.argv[1:], dict(os.environ)
while args and args[0].startswith("--"):
    if args[0] == "--log-file":
        env["FAKE_SAN_LOG"] = args[1]
    args = args[2:]
rc = subprocess.call(args, env=env)
errors = 0
for log in glob.glob(env["FAKE_SAN_LOG"].replace("%p", "*")):
    printed = open(log).read().count("========= Uninitialized")
    pid = log.rsplit(".", 2)[-2]
    extra = os.path.join(env["DROPPED"], pid)
    dropped = int(open(extra).read()) if os.path.exists(extra) else 0
    errors += printed + dropped
    with open(log, "a") as f:
        f.write(f"========= ERROR SUMMARY: {{printed + dropped}} errors\\n")
        if dropped:
            f.write(f"========= ERROR SUMMARY: {{dropped}} errors were not printed. Use "
                    "--print-limit option to adjust the number of printed errors\\n")
sys.exit(86 if errors else rc)
"""

BUDGET_SUITE = textwrap.dedent("""
    import os, pytest
    TEXT = open(os.path.join(os.environ["FIXTURES"], "initcheck_uninit_planted_h200.log")).read()
    RECORDS = "".join(line for line in TEXT.splitlines(True) if "SUMMARY" not in line)  # 20

    def write(times, dropped=0):
        log = os.environ["FAKE_SAN_LOG"].replace("%p", str(os.getpid()))
        with open(log, "a") as f:
            f.write(RECORDS * times)
        if dropped:
            with open(os.path.join(os.environ["DROPPED"], str(os.getpid())), "w") as f:
                f.write(str(dropped))

    @pytest.mark.sanitizer
    def test_a():
        write(45)  # 900 records: fewer than a case's 200 left in this process

    @pytest.mark.sanitizer
    def test_b():
        write(50, dropped=300)  # the process's 1000th record, and 300 more not printed

    @pytest.mark.sanitizer
    def test_c():
        write(1)

    @pytest.mark.sanitizer
    def test_d():
        assert True
""")


def test_no_case_runs_after_the_print_budget_is_spent_without_a_fresh_worker(tmp_path, monkeypatch):
    from gpucheck.model.runlog import RunLog
    from gpucheck.sanitizer import command

    assert (command.PRINT_LIMIT, command.CASE_RECORDS) == (1000, 200)
    tool = tmp_path / "compute-sanitizer"
    tool.write_text(COUNTING_TOOL)
    tool.chmod(0o755)
    suite = tmp_path / "suites" / "budget"
    suite.mkdir(parents=True)
    (suite / "test_budget.py").write_text(BUDGET_SUITE)
    (tmp_path / "dropped").mkdir()
    monkeypatch.setenv("FIXTURES", str(FIXTURES))
    monkeypatch.setenv("DROPPED", str(tmp_path / "dropped"))
    out = _run(tmp_path, {"budget": suite}, "initcheck", tool, 120)
    recs = {
        r.case.rsplit("::", 1)[-1]: r for r in RunLog.read(out / "results.jsonl").diagnosed_cases()
    }
    assert sorted(recs) == ["test_a", "test_b", "test_c", "test_d"]  # none given up on
    # a fresh worker after test_a (900 of its 1000 records printed) and after test_b (1000)
    assert len(list((out / "workers").glob("*.state.json"))) == 3
    assert [f.kind for f in recs["test_a"].findings] == ["sanitizer"]
    limit = [f for f in recs["test_b"].findings if f.kind == "sanitizer-limit"]
    [f] = limit
    assert f.severity == "warning" and "300 more record(s) it counted were not printed" in f.message
    # the next case ran under a fresh tool: its records are there
    [c] = recs["test_c"].findings
    assert c.kind == "sanitizer" and "x20" in c.message
    assert recs["test_d"].findings == [] and recs["test_d"].status == "passed"
