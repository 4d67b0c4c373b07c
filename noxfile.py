"""Sessions for gpucheck's CI and maintainers: `nox -s tests lint typecheck compile` (CPU),
`nox -s gpu sanitize` (need GPUs; not run by default).

Sessions see the interpreter's site-packages, so an installed torch (a CUDA build on GPU
machines) is used as it is and never reinstalled; where no torch is installed at all,
$GPUCHECK_TORCH (default torch==2.13.0, a CPU build on our CI machines) is installed.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests", "lint", "typecheck", "compile"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

TORCH_SPEC = os.environ.get("GPUCHECK_TORCH", "torch==2.13.0")
VENV = {"venv_params": ["--system-site-packages"]}


def _ensure_torch(session: nox.Session) -> None:
    found = session.run(
        "python", "-c", "import importlib.util as u; print(u.find_spec('torch') is not None)",
        silent=True,
    )
    if "True" not in str(found):
        session.install(TORCH_SPEC)


def _install(session: nox.Session, extras: str, build_extension: bool = False) -> None:
    _ensure_torch(session)
    if build_extension:  # the extension build must see this environment's (CUDA) torch
        session.install("setuptools>=69", "wheel")
        session.install("--no-build-isolation", "-e", f".[{extras}]")
    else:
        session.install("-e", f".[{extras}]", env={"GPUCHECK_NO_EXTENSION": "1"})


@nox.session(**VENV)
def tests(session: nox.Session) -> None:
    """CPU tests: parsers, detectors, references, harness and report on real outputs."""
    _install(session, "test")
    session.run("python", "-m", "pytest", "tests", *session.posargs)


@nox.session(**VENV)
def lint(session: nox.Session) -> None:
    """Ruff over the package, tests, suites, benchmarks and examples."""
    session.install("ruff>=0.6")
    paths = [p for p in ("gpucheck", "tests", "suites", "benchmarks", "examples", "noxfile.py",
                         "setup.py")
             if os.path.exists(p)]
    session.run("python", "-m", "ruff", "check", *paths)


@nox.session(**VENV)
def typecheck(session: nox.Session) -> None:
    """Mypy over the package."""
    _install(session, "dev")
    session.run("mypy")


@nox.session(**VENV)
def compile(session: nox.Session) -> None:
    """Compile (not link) every csrc/ source for sm_90 against torch's headers; no GPU needed."""
    _ensure_torch(session)
    session.run("python", "-m", "gpucheck._csrc", *session.posargs)


@nox.session(**VENV, default=False)
def gpu(session: nox.Session) -> None:
    """Build the extension and run every suite on every visible GPU (blocking + nvml)."""
    _install(session, "test", build_extension=True)
    session.run("gpucheck", "run", "--all-devices", *session.posargs)


@nox.session(**VENV, default=False)
def sanitize(session: nox.Session) -> None:
    """Run the suites' small cases under compute-sanitizer memcheck on every GPU."""
    _install(session, "test", build_extension=True)
    session.run("gpucheck", "run", "--all-devices", "--mode", "sanitizer:memcheck",
                *session.posargs)
