"""Where the files gpucheck ships live: its CUDA sources, its suites and the worked example.

The repository keeps them in top-level folders (``csrc/``, ``suites/``, ``examples/``); the
build maps each into the package as ``gpucheck.<name>`` (setup.py reads :data:`BUNDLED`), so a
wheel, an sdist install and an editable install (setuptools' import hook) all find them the
same way: through the package, with :mod:`importlib.resources`, wherever it is installed.

This module must not import torch, and setup.py loads it by path (before gpucheck exists).
"""

from __future__ import annotations

import functools
import importlib.resources
import os
from pathlib import Path

#: bundled folders: the subpackage of gpucheck -> the folder of the repository it is built from
BUNDLED: dict[str, str] = {"csrc": "csrc", "suites": "suites", "examples": "examples"}
#: the files of the bundled folders that the package carries (setuptools package_data globs)
BUNDLED_FILES = [
    "**/*.py",
    "**/*.h",
    "**/*.cuh",
    "**/*.cpp",
    "**/*.cu",
    "**/*.md",
    "**/*.sh",
    "**/*.toml",
]
#: the worked example's folder in ``examples/``
EXAMPLE = "custom_rnn_extension"


def path(name: str) -> Path:
    """The folder of the bundled ``name`` (a key of :data:`BUNDLED`) in the installed package;
    where gpucheck is imported from a checkout's ``gpucheck/`` instead (a process started in
    a checkout, whose folder comes first on ``sys.path``, beside a wheel installed from it),
    the checkout's own folder.

    Raises:
        gpucheck.errors.EnvironmentProblem: neither is there.
    """
    package = f"gpucheck.{name}"
    try:
        root = importlib.resources.files(package)
    except ModuleNotFoundError as err:
        checkout = Path(__file__).resolve().parent.parent / BUNDLED[name]
        if (checkout / "__init__.py").is_file():
            return checkout
        from gpucheck.errors import EnvironmentProblem

        raise EnvironmentProblem(
            f"gpucheck's bundled {BUNDLED[name]}/ folder is not installed ({package} cannot "
            "be imported): install gpucheck with pip (`pip install -e .` in a checkout)"
        ) from err
    return Path(str(root))


def csrc() -> Path:
    """gpucheck's CUDA sources (one folder per kernel; the defects are macros in them)."""
    return path("csrc")


def suites() -> Path:
    """gpucheck's own suites, one folder each (``ssim``, ``knn``, ``selftest``, ...)."""
    return path("suites")


def example() -> Path:
    """The worked example, a custom RNN extension: its csrc/, Python package, suite, README."""
    return path("examples") / EXAMPLE


# -- whose code a frame is ------------------------------------------------------------------
#: gpucheck's package folder
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: folders of the package that hold users' code as far as frames go (the bundled suites and
#: the worked example are what a user's own suite and extension would be)
_USERS_IN_PACKAGE = tuple(os.path.join(PACKAGE_DIR, name) + os.sep for name in BUNDLED)
_TORCH_PARTS = ("/site-packages/torch/", "/dist-packages/torch/")


def own_code(path: str) -> bool:
    """Whether a source file is gpucheck's own machinery (not a bundled suite or example):
    frames there are never the place a finding points a user at."""
    return path.startswith(PACKAGE_DIR + os.sep) and not path.startswith(_USERS_IN_PACKAGE)


def torch_code(path: str, torch_dir: str | None = None) -> bool:
    """Whether a source file is torch's (``torch_dir``: torch's package folder when known)."""
    if torch_dir is not None:
        return path.startswith(torch_dir)
    return any(part in path for part in _TORCH_PARTS)


#: torch's files that sit between a user's call and an extension's function (its op objects'
#: ``__call__``, ``autograd.Function.apply``, autocast's decorators, ``custom_op``), by name:
#: compute-sanitizer names a Python frame's file without its folder
_TORCH_CALL_FILES = frozenset(
    ("_ops.py", "function.py", "autocast_mode.py", "custom_ops.py", "_contextlib.py")
)


@functools.cache
def own_files() -> frozenset[str]:
    """The file names of gpucheck's own modules (bundled suites and the example left out, and
    names every package has: ``__init__.py``, ``__main__.py``)."""
    names: set[str] = set()
    for root, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = [d for d in dirs if os.path.join(root, d) + os.sep not in _USERS_IN_PACKAGE]
        names.update(f for f in files if f.endswith(".py"))
    return frozenset(names - {"__init__.py", "__main__.py"})


def user_code(where: str, torch_dir: str | None = None) -> bool:
    """The rule for the frame a finding names: the first frame whose file is neither
    gpucheck's own machinery nor torch's (:func:`own_code`, :func:`torch_code`). ``where``
    is a path or ``path:line``; a bare file name (compute-sanitizer's Python frames) is
    judged by name: gpucheck's module names and torch's call-path files."""
    path, _, line = where.rpartition(":")
    if not (path and line.isdigit()):
        path = where
    if os.sep not in path and "/" not in path:
        return path not in own_files() and path not in _TORCH_CALL_FILES
    return not own_code(path) and not torch_code(path, torch_dir)
