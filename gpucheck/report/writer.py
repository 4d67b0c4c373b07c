"""The one protocol every report format implements, and what each is written from.

A format is a :class:`Writer`: a pure function of the run's :class:`Report` (and of where its
file goes: the links of a page are relative to it) that returns the file's text. The formats
are registered in one table, :data:`gpucheck.report.WRITERS`; :func:`gpucheck.report.publish`
calls each one asked for the same way and writes its file (:func:`write_file`), so a new
format is a module with its writer and one line there (its file named in
:data:`gpucheck.model.layout.REPORTS`, with the run folder's other names).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpucheck.model import clock
from gpucheck.report import groups
from gpucheck.report.groups import Grouped
from gpucheck.report.rundata import RunData
from gpucheck.report.summary import Cell, Summary, matrix
from gpucheck.report.verdict import Verdict


@dataclass(frozen=True)
class Report:
    """What every format is written from: the run as read, its verdict, its findings
    grouped (diagnoses first), its numbers and matrix, and when the reports were made."""

    data: RunData
    verdict: Verdict
    grouped: Grouped
    summary: Summary
    matrix: list[Cell] = field(default_factory=list)
    generated_at: str = ""

    @classmethod
    def of(cls, data: RunData, verdict: Verdict) -> Report:
        return cls(
            data,
            verdict,
            groups.build(data.cases),
            Summary.of(data, verdict),
            matrix(data),
            clock.now("seconds"),
        )


class Writer(Protocol):
    """One report format."""

    def __call__(self, report: Report, path: Path) -> str | bytes:
        """The text of the format's file for ``report``, to be written at ``path``."""
        ...


def write_file(path: Path, content: str | bytes) -> Path:
    """Write through a fresh temporary file beside ``path`` (created, never opened through a
    link a folder someone else made may hold), then put it in place: a reader never sees half
    a report, and nothing outside the folder is written."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:  # name the report, not the temporary file
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content.encode("utf-8") if isinstance(content, str) else content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):  # name the report, not the temporary file
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise
    return path
