"""The compute-sanitizer command line a worker runs under (modes ``sanitizer[:TOOL]``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpucheck.errors import EnvironmentProblem

#: exit code compute-sanitizer gives the process when it reported errors (--error-exitcode)
ERROR_EXIT = 86
#: records printed per process (the rest are only counted in ERROR SUMMARY)
PRINT_LIMIT = 200


def find() -> Path:
    """The compute-sanitizer executable, or a one-sentence EnvironmentProblem."""
    found = shutil.which("compute-sanitizer")
    if found:
        return Path(found)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "compute-sanitizer").exists():
            return Path(home) / "bin" / "compute-sanitizer"
    raise EnvironmentProblem(
        "compute-sanitizer was not found (it ships with the CUDA toolkit: put its bin/ on PATH "
        "or set CUDA_HOME); the sanitizer modes cannot run")


def prefix(tool: str, log: Path, executable: Path | None = None) -> list[str]:
    """Arguments that go before the worker's own command."""
    return [str(executable or find()), "--tool", tool, "--log-file", str(log),
            "--error-exitcode", str(ERROR_EXIT), "--target-processes", "all",
            "--print-limit", str(PRINT_LIMIT)]


def env() -> dict[str, str]:
    """The caching allocator hides out-of-bounds accesses inside its blocks: turn it off."""
    return {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDA_LAUNCH_BLOCKING": "1"}
