"""The distribution gpucheck is installed as, and the one other distribution that installs a
``gpucheck`` module too.

The import package and the command are ``gpucheck``; the distribution (what pip installs,
the wheel's file name, the ``pytest11`` entry point's name) is :data:`NAME`: the name
``gpucheck`` on the public package index belongs to an unrelated project (:data:`OTHER`),
which installs a ``gpucheck`` module and a pytest plugin of its own. Where both are installed
in one environment their files overwrite each other; :func:`conflict` says so in one
sentence, and the command and the pytest plugin stop with it instead of misbehaving.

This module must not import anything of gpucheck's (it runs before the rest, and the other
project's ``gpucheck/__init__.py`` may be the one installed).
"""

from __future__ import annotations

import importlib.metadata

#: the distribution's name (pyproject.toml's ``[project] name``)
NAME = "torch-gpucheck"
#: the unrelated distribution of the same import name on the public package index
OTHER = "gpucheck"
#: the summary this project's distribution had under the name :data:`OTHER`, before it had
#: its own (an install from an older checkout)
SUMMARY = "Diagnostic and testing toolkit for multi-GPU PyTorch CUDA extensions"


def _installed(name: str) -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def conflict() -> str | None:
    """One sentence when a distribution named :data:`OTHER` is installed beside :data:`NAME`
    (both install the ``gpucheck`` module), saying which to remove; None otherwise."""
    other = _installed(OTHER)
    if other is None or _installed(NAME) is None:
        return None
    fix = (
        f"remove it (`python -m pip uninstall {OTHER}`), then install {NAME} again "
        "(`python -m pip install --force-reinstall --no-deps` of its wheel, or `-e .` in "
        "its checkout)"
    )
    if (other.metadata["Summary"] or "") == SUMMARY:
        return (
            f"this environment holds an older install of gpucheck under the distribution "
            f"name {OTHER!r} beside {NAME} and both install the `gpucheck` module: {fix}"
        )
    return (
        f"the unrelated distribution {OTHER!r} (another project of the same import name, "
        f"{other.metadata['Summary'] or 'not gpucheck'!r}) is installed beside {NAME} and "
        f"overwrites its `gpucheck` module and pytest plugin: {fix}"
    )
