"""The run header's ``config``: the settings of a run, what ``gpucheck run --resume`` replays.

The controller writes them into the header as the run starts
(:func:`gpucheck.controller.config.header_record`), ``gpucheck merge`` copies the first
part's into the merged header (with ``merged_from``), and ``--resume``, ``merge`` and the
reports read them back through :meth:`RunSettings.from_json`. ``--resume`` runs code (the
suites the settings name, with their pytest arguments), so the reader says what it could not
take (:attr:`RunSettings.problems`, one sentence each) and the controller refuses a folder
whose settings gpucheck does not write.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def shard_of(shard: str | None) -> tuple[int, int] | None:
    """(index, count) of a shard as recorded (``"I/N"``), None for none (or not one)."""
    index, _, count = (shard or "").partition("/")
    return (int(index), int(count)) if index.isdigit() and count.isdigit() else None


@dataclass
class RunSettings:
    """The settings of a run as ``gpucheck run`` was asked (its targets themselves are the
    header's ``devices``)."""

    all_devices: bool = False
    devices: list[int] = field(default_factory=list)
    suites: list[str] = field(default_factory=list)
    #: suite name -> its folder, as resolved when the run started
    suite_paths: dict[str, str] = field(default_factory=dict)
    modes: list[str] = field(default_factory=list)
    timeout: float | None = None  # None: not recorded (the default applies)
    cpu_only: bool = False
    pytest_args: list[str] = field(default_factory=list)
    nvml_interval: float | None = None  # None: not recorded (the default applies)
    allow_empty: bool = False
    distributed: bool = False
    world_size: int | None = None
    backend: str | None = None
    shard: str | None = None  # "I/N" of a --shard run
    durations: str | None = None  # the earlier run --shard balanced by
    ray: str | None = None  # the Ray cluster of a --ray run
    #: a merged run's: the run folders it was made from (``gpucheck merge``)
    merged_from: list[str] = field(default_factory=list)
    #: whether the header held settings at all (a gpucheck before they were recorded did not)
    recorded: bool = field(default=True, compare=False)
    #: what the reader could not take, one sentence each (the value read instead is the
    #: default); gpucheck never writes such settings
    problems: list[str] = field(default_factory=list, compare=False)

    @property
    def shard_of(self) -> tuple[int, int] | None:
        """(index, count) of ``--shard I/N``, None for a run that was not a shard."""
        return shard_of(self.shard)

    def to_json(self) -> dict[str, Any]:
        """The header's ``config`` object (``merged_from`` only for a merged run)."""
        out = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("recorded", "problems", "merged_from")
        }
        if self.merged_from:
            out["merged_from"] = self.merged_from
        return out

    @classmethod
    def from_json(cls, value: Any) -> RunSettings:
        """The settings as read back: every setting of its type, else its default and a
        sentence in :attr:`problems`; ``recorded`` False when there were none."""
        if not isinstance(value, dict) or not value:
            return cls(recorded=False)
        read = _Reader(value)
        return cls(
            all_devices=read.flag("all_devices"),
            devices=read.items("devices", int),
            suites=read.items("suites", str),
            suite_paths=read.paths(),
            modes=read.items("modes", str),
            timeout=read.number("timeout"),
            cpu_only=read.flag("cpu_only"),
            pytest_args=read.items("pytest_args", str),
            nvml_interval=read.number("nvml_interval"),
            allow_empty=read.flag("allow_empty"),
            distributed=read.flag("distributed"),
            world_size=read.maybe("world_size", int),
            backend=read.maybe("backend", str),
            shard=read.loose("shard"),
            durations=read.loose("durations"),
            ray=read.loose("ray"),
            merged_from=[v for v in value.get("merged_from") or [] if isinstance(v, str)]
            if isinstance(value.get("merged_from"), list)
            else [],
            problems=read.problems,
        )


#: the order in which the reader's notes are given (a refusal names the first)
_ORDER = (
    "all_devices",
    "cpu_only",
    "allow_empty",
    "distributed",
    "timeout",
    "nvml_interval",
    "world_size",
    "backend",
    "devices",
    "suites",
    "modes",
    "pytest_args",
    "suite_paths",
)


class _Reader:
    """Reads the settings of one header, noting each that is not of its type."""

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value
        self._notes: dict[str, str] = {}

    def _bad(self, name: str) -> None:
        self._notes[name] = f"its recorded setting {name!r} is {self.value.get(name)!r}"

    @property
    def problems(self) -> list[str]:
        return [self._notes[n] for n in _ORDER if n in self._notes]

    def maybe(self, name: str, kind: type) -> Any:
        raw = self.value.get(name)
        if raw is None or (isinstance(raw, kind) and not isinstance(raw, bool)):
            return raw
        self._bad(name)
        return None

    def flag(self, name: str) -> bool:
        raw = self.value.get(name)
        if raw is not None and not isinstance(raw, bool):
            self._bad(name)
        return raw is True

    def number(self, name: str) -> float | None:
        raw = self.value.get(name)
        if raw is None:
            return None
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        self._bad(name)
        return None

    def loose(self, name: str) -> str | None:
        """A text setting nothing runs from: one of another type reads as not recorded."""
        raw = self.value.get(name)
        return raw if isinstance(raw, str) else None

    def items(self, name: str, kind: type) -> list[Any]:
        raw = self.value.get(name) or []
        if isinstance(raw, list) and all(
            isinstance(v, kind) and not isinstance(v, bool) for v in raw
        ):
            return list(raw)
        self._notes[name] = f"its recorded setting {name!r} is {raw!r}"
        return []

    def paths(self) -> dict[str, str]:
        raw = self.value.get("suite_paths") or {}
        if isinstance(raw, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
        ):
            return dict(raw)
        self._notes["suite_paths"] = f"its recorded suite paths are {raw!r}"
        return {}
