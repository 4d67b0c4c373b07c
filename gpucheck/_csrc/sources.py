"""Where the CUDA sources are: the kernel folders of ``csrc/`` (GPUCHECK_KERNELS), the
extension's translation units, the headers a source includes.

The sources are the bundled ``gpucheck.csrc`` (gpucheck._resources). This module must not
import torch or gpucheck at import time: setup.py loads it by path and passes its own csrc/.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

EXTENSION_NAME = "gpucheck._C"
#: Environment variable selecting a subset of kernels (comma separated folder names of csrc/).
KERNELS_ENV = "GPUCHECK_KERNELS"


def csrc_dir() -> Path:
    """The CUDA sources of the installed package (``gpucheck.csrc``)."""
    from gpucheck import _resources

    return _resources.csrc()


def example_csrc_dir() -> Path:
    """The sources of the worked example's extension (``examples/custom_rnn_extension/csrc``)."""
    from gpucheck import _resources

    return _resources.example() / "csrc"


def kernels(csrc: Path | None = None) -> list[str]:
    """Names of the kernel folders of ``csrc`` (default: the bundled one) that hold sources,
    honouring GPUCHECK_KERNELS."""
    csrc = csrc_dir() if csrc is None else csrc
    found = (
        sorted(
            p.name
            for p in csrc.iterdir()
            if p.is_dir() and (any(p.glob("*.cu")) or any(p.glob("*.cpp")))
        )
        if csrc.is_dir()
        else []
    )
    wanted = [k.strip() for k in os.environ.get(KERNELS_ENV, "").split(",") if k.strip()]
    if wanted:
        unknown = sorted(set(wanted) - set(found))
        if unknown:
            raise SystemExit(f"{KERNELS_ENV} names unknown kernels {unknown}; csrc/ has {found}")
        return [k for k in found if k in wanted]
    return found


def sources(csrc: Path | None = None) -> list[Path]:
    """All translation units of the extension: csrc/*.cpp plus csrc/<kernel>/*.{cpp,cu} (of
    ``csrc``, default: the bundled one)."""
    csrc = csrc_dir() if csrc is None else csrc
    if not csrc.is_dir():
        return []
    files = sorted(csrc.glob("*.cpp"))
    for k in kernels(csrc):
        files += sorted((csrc / k).glob("*.cpp")) + sorted((csrc / k).glob("*.cu"))
    return files


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def mentions(path: Path, word: str, seen: set[Path] | None = None) -> bool:
    """Whether ``path`` or a header it includes with quotes (found in csrc/ or next to it)
    names ``word``."""
    seen = set() if seen is None else seen
    if path in seen or not path.is_file():
        return False
    seen.add(path)
    text = path.read_text(errors="replace")
    if word in text:
        return True
    return any(
        mentions(base / inc, word, seen)
        for inc in _INCLUDE.findall(text)
        for base in (csrc_dir(), path.parent)
    )
