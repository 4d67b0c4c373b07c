"""The compute-sanitizer command line a worker runs under (modes ``sanitizer[:TOOL]``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpucheck.errors import EnvironmentProblem
from gpucheck.model.kinds import SYMPTOM, Kind

#: exit code compute-sanitizer gives the process when it reported errors (--error-exitcode)
ERROR_EXIT = 86
#: records printed per process (the rest are only counted in ERROR SUMMARY)
PRINT_LIMIT = 1000
#: records each case may print: a worker whose logs hold more than ``PRINT_LIMIT`` less this
#: after a case ends, and a fresh one (a fresh compute-sanitizer) runs the next cases
CASE_RECORDS = 200
#: the finding of a case during which the print limit was reached (records were dropped)
LIMIT_REACHED = "sanitizer-limit"
#: the finding of a case during which compute-sanitizer itself crashed
TOOL_CRASH = "sanitizer-crash"
TOOL_CRASH_HINT = (
    "compute-sanitizer itself ended (not the process it watched): this case's "
    "result under the sanitizer is unknown, and a fresh worker ran the cases "
    "not yet recorded. Run the case alone under compute-sanitizer: a tool that "
    "crashes on it again is a compute-sanitizer bug (try another CUDA "
    "toolkit's); the tool's last words are in the worker's stderr tail"
)
SANITIZER_CRASH = Kind(
    TOOL_CRASH,
    SYMPTOM,
    hint="run the case alone under compute-sanitizer; the tool's crash hides the case's "
    "result, it is not the case's own",
    title="compute-sanitizer crashes",
    about="compute-sanitizer itself ended while its worker ran: the case's outcome is unknown",
)


def find() -> Path:
    """The compute-sanitizer executable: on PATH, else in the toolkit's bin/ ($CUDA_HOME or
    $CUDA_PATH where set: the toolkit asked for, never another; /usr/local/cuda where
    neither is); or a one-sentence EnvironmentProblem, raised before anything runs."""
    found = shutil.which("compute-sanitizer")
    if found:
        return Path(found)
    homes = [h for h in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")) if h]
    bins = [Path(home) / "bin" for home in homes or ["/usr/local/cuda"]]
    for folder in bins:
        if (folder / "compute-sanitizer").exists():
            return folder / "compute-sanitizer"
    raise EnvironmentProblem(
        f"compute-sanitizer was not found on PATH nor in {' or '.join(map(str, bins))} (it "
        "ships with the CUDA toolkit: put its bin/ on PATH or set CUDA_HOME); the sanitizer "
        "modes cannot run, and nothing was run"
    )


def prefix(tool: str, log: Path, executable: Path | None = None) -> list[str]:
    """Arguments that go before the worker's own command."""
    return [
        str(executable or find()),
        "--tool",
        tool,
        "--log-file",
        str(log),
        "--error-exitcode",
        str(ERROR_EXIT),
        "--target-processes",
        "all",
        "--print-limit",
        str(PRINT_LIMIT),
    ]


def env() -> dict[str, str]:
    """The caching allocator hides out-of-bounds accesses inside its blocks: turn it off."""
    return {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDA_LAUNCH_BLOCKING": "1"}
