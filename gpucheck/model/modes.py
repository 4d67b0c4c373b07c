"""A pass's mode label as a type: what it instruments, which device is current, which re-run.

Labels are what records carry in their ``mode`` field:

* ``blocking+nvml`` (or either alone): the plain pass, ``CUDA_LAUNCH_BLOCKING=1`` and/or NVML;
* ``sanitizer:TOOL``: a compute-sanitizer pass (a bare ``sanitizer`` is memcheck);
* ``dist``: a distributed pass (one torch.distributed group);
* a base label followed by one arrangement: ``|target-current`` (the pass again with each
  case's target device current, sanitizer passes on 2+ GPUs), ``|rerun:target-current`` (the
  wrong-device check's re-run of a pass's suspects, target current) or
  ``|rerun:other-current`` (its control: another device current again, in a fresh worker).
"""

from __future__ import annotations

from dataclasses import dataclass

#: the instruments of the plain pass, in the order labels name them
PLAIN = ("blocking", "nvml")
#: the label of a pass with no instrument (``--cpu-only`` with nothing to run but plain pytest)
BARE = "plain"
SANITIZER = "sanitizer"
SANITIZER_TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
DIST = "dist"
#: the arrangements a case can run in besides the default (another device current)
TARGET_CURRENT = "target-current"
RERUN_TARGET = "rerun:target-current"
RERUN_CONTROL = "rerun:other-current"
VARIANTS = (TARGET_CURRENT, RERUN_TARGET, RERUN_CONTROL)


@dataclass(frozen=True)
class Mode:
    """A parsed mode label; ``str(mode)`` is the label again."""

    base: str  # "blocking+nvml", "sanitizer:racecheck", "dist"
    variant: str = ""  # "" or one of VARIANTS

    @classmethod
    def parse(cls, label: str) -> Mode:
        base, _, variant = str(label).partition("|")
        if variant and variant not in VARIANTS:
            raise ValueError(f"unknown mode variant {variant!r} in {label!r}")
        if base.startswith(SANITIZER):
            _, _, tool = base.partition(":")
            if tool and tool not in SANITIZER_TOOLS:
                raise ValueError(f"unknown compute-sanitizer tool {tool!r} in {label!r}")
        elif base not in (DIST, BARE) and not (base and set(base.split("+")) <= set(PLAIN)):
            raise ValueError(f"unknown mode {label!r}")
        return cls(base, variant)

    @classmethod
    def plain(cls, instruments: tuple[str, ...] | list[str]) -> Mode:
        """The plain pass of these instruments (``blocking``, ``nvml``), in label order."""
        return cls("+".join(m for m in PLAIN if m in instruments))

    @classmethod
    def sanitizer(cls, tool: str) -> Mode:
        return cls.parse(f"{SANITIZER}:{tool}")

    def __str__(self) -> str:
        return f"{self.base}|{self.variant}" if self.variant else self.base

    @property
    def instruments(self) -> tuple[str, ...]:
        """``("blocking", "nvml")`` of a plain pass; empty for the others."""
        if self.base.startswith(SANITIZER) or self.base in (DIST, BARE):
            return ()
        return tuple(self.base.split("+"))

    @property
    def blocking(self) -> bool:
        return "blocking" in self.instruments

    @property
    def nvml(self) -> bool:
        return "nvml" in self.instruments

    @property
    def sanitizer_tool(self) -> str | None:
        """The compute-sanitizer tool of a sanitizer pass (a bare ``sanitizer``: memcheck)."""
        if not self.base.startswith(SANITIZER):
            return None
        return self.base.partition(":")[2] or "memcheck"

    @property
    def target_current(self) -> bool:
        """The case's own target device is current (no other device touched)."""
        return self.variant in (TARGET_CURRENT, RERUN_TARGET)

    @property
    def rerun(self) -> bool:
        """A re-run of the wrong-device check (evidence, not a pass of its own)."""
        return self.variant in (RERUN_TARGET, RERUN_CONTROL)

    def with_variant(self, variant: str) -> Mode:
        if variant and variant not in VARIANTS:
            raise ValueError(f"unknown mode variant {variant!r}")
        return Mode(self.base, variant)

    @property
    def pass_base(self) -> Mode:
        """The pass without its arrangement (``sanitizer:memcheck|target-current`` ->
        ``sanitizer:memcheck``)."""
        return Mode(self.base)


def try_parse(label: object) -> Mode | None:
    """The mode of a record read from a file (None for a label no gpucheck writes)."""
    try:
        return Mode.parse(str(label))
    except ValueError:
        return None


def tool_of(label: object) -> str | None:
    """The compute-sanitizer tool a mode label names (None: not a sanitizer pass, or a label
    no gpucheck writes)."""
    parsed = try_parse(label)
    return parsed.sanitizer_tool if parsed is not None else None
