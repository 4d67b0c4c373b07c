"""The one clock of a run's records: every timestamp a record or a run-folder file carries is
UTC ISO-8601 with milliseconds (``2026-11-24T01:28:11.921+00:00``); a stamp someone else wrote
(a local offset, a trailing ``Z``) still reads (:func:`parse`). What is only shown to a person
(a run folder's name, a console line) is local time, made here too."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any


def now(timespec: str = "milliseconds") -> str:
    """This moment as a record stamps it."""
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


def iso(t: float, timespec: str = "milliseconds") -> str:
    """Epoch seconds as a record stamps them."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec=timespec)


def parse(value: Any) -> float | None:
    """A stamp (this clock's, or a local one an older gpucheck wrote) as epoch seconds, or
    None when it is not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        return None
    return t if math.isfinite(t) else None


def folder_stamp() -> str:
    """This moment in local time, for a run folder's default name (``20261124-012806``)."""
    return datetime.now().strftime("%Y%m%d-%H%M%S")


def local_time(t: float) -> str:
    """Epoch seconds as a console line shows them (local ``HH:MM:SS``)."""
    return f"{datetime.fromtimestamp(t):%H:%M:%S}"
