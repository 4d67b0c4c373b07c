"""The one way the tests start gpucheck's CLI as a real process: ``python -m gpucheck`` (the
``gpucheck`` script's own entry point, :mod:`gpucheck.__main__`, with the first worker's
interpreter started before the command line is read) with this interpreter, so that the
gpucheck under test (the checkout, or the installed wheel in ``nox -s package``) is the one
that runs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpucheck.model import results

#: the command line that starts the CLI
GPUCHECK = (sys.executable, "-m", "gpucheck")
#: ``env`` of a run that must see no GPU, whatever this machine has
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def _environ(env: Mapping[str, str | None] | None) -> dict[str, str]:
    """This process's environment with ``env`` over it; a variable given None is left out."""
    return {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}


def gpucheck(
    *args: str | bytes | Path,
    cwd: str | Path | None = None,
    env: Mapping[str, str | None] | None = None,
    timeout: float = 180,
    **kw: Any,
) -> subprocess.CompletedProcess[str]:
    """``gpucheck ARGS`` run to its end in ``cwd``, its output captured as text; ``env`` over
    this process's environment; ``kw`` to :func:`subprocess.run` (``errors=``, ...)."""
    return subprocess.run(
        [*GPUCHECK, *args],
        cwd=cwd,
        env=_environ(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def start(
    *args: str | bytes | Path,
    cwd: str | Path | None = None,
    env: Mapping[str, str | None] | None = None,
    **kw: Any,
) -> subprocess.Popen[str]:
    """``gpucheck ARGS`` started in ``cwd``, stdout and stderr piped as text (``stdout=`` /
    ``stderr=`` send them elsewhere); ``env`` over this process's environment; ``kw`` to
    :class:`subprocess.Popen` (``preexec_fn=``, ``start_new_session=``, ...)."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([*GPUCHECK, *args], cwd=cwd, env=_environ(env), text=True, **kw)


def run_suite(
    root: Path, suite: str, files: Mapping[str, str], *args: str, timeout: float = 180
) -> tuple[subprocess.CompletedProcess[str], dict[str, dict[str, Any]]]:
    """A suite of ``files`` (name: source) written to ``root/suites/<suite>`` and run there by
    ``gpucheck run --cpu-only --quiet --out root/out ARGS``: the process, and the case records
    by case id."""
    folder = root / "suites" / suite
    folder.mkdir(parents=True)
    for name, source in files.items():
        (folder / name).write_text(source)
    out = root / "out"
    proc = gpucheck(
        "run", "--cpu-only", "--quiet", "--out", str(out), *args, cwd=root, timeout=timeout
    )
    return proc, {r["case"]: r for r in results.cases(out / "results.jsonl")}
