"""README.md's runnable shell blocks, as its readers run them.

Each ```` ```bash ```` block of README.md is marked on the line before it with what runs it:

- ``<!-- readme: cpu -->``: runs as written on a machine without a GPU (``nox -s readme``
  runs it in a fresh venv of a fresh copy of the checkout);
- ``<!-- readme: gpu -->``: needs NVIDIA GPUs (``tools/gpu readme`` runs it as written on
  one; ``nox -s readme`` runs it without a GPU with torch held to the CPU build, where it
  must pass or end in gpucheck's one sentence saying no GPU is usable);
- ``<!-- readme: ci -->``: ``.ci/run`` runs it, as written.

A block whose lines begin another block of its kind (the install lines of a block that then
runs something) is run as part of that one (:func:`covered`). Standard library only: the GPU
machine's step and the noxfile load this file by path.

Command line: ``python tools/readme_blocks.py KIND`` lists the blocks of KIND to run (line
number and first command); ``python tools/readme_blocks.py KIND LINE`` prints the block that
starts at LINE, to run with ``bash -e``.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
KINDS = ("cpu", "gpu", "ci")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!-- readme: (\w+) -->")


@dataclass(frozen=True)
class Block:
    """One marked shell block: its kind, its text and the line of README.md it starts at."""

    kind: str
    code: str
    line: int

    @property
    def commands(self) -> list[str]:
        """Its lines that are not blank or comments."""
        return [s for s in (c.strip() for c in self.code.splitlines()) if s and s[0] != "#"]


def blocks(text: str) -> list[Block]:
    """Every marked ``bash`` block of ``text``, in order.

    Raises:
        ValueError: a ``bash`` block without a marker, or a marker of an unknown kind.
    """
    found = []
    for fence in _FENCE.finditer(text):
        if fence.group(1) != "bash":
            continue
        line = text.count("\n", 0, fence.start()) + 1
        before = text[: fence.start()].splitlines()[-1:]
        mark = _MARK.fullmatch(before[0].strip()) if before else None
        if mark is None:
            raise ValueError(
                f"README.md:{line}: a bash block without a `<!-- readme: KIND -->` line "
                f"before it (KIND: {', '.join(KINDS)})"
            )
        if mark.group(1) not in KINDS:
            raise ValueError(f"README.md:{line}: unknown kind {mark.group(1)!r}")
        found.append(Block(mark.group(1), fence.group(2), line))
    return found


def covered(block: Block, every: list[Block]) -> Block | None:
    """The block of the same kind that runs ``block``'s lines first, then more (None: it
    runs on its own)."""
    mine = block.commands
    return next(
        (
            other
            for other in every
            if other is not block
            and other.kind == block.kind
            and len(other.commands) > len(mine)
            and other.commands[: len(mine)] == mine
        ),
        None,
    )


def to_run(kind: str, text: str | None = None) -> list[Block]:
    """The blocks of ``kind`` that run on their own (the others run inside them)."""
    every = blocks(README.read_text(encoding="utf-8") if text is None else text)
    return [b for b in every if b.kind == kind and covered(b, every) is None]


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in KINDS or len(argv) > 2:
        print(f"usage: readme_blocks.py {{{','.join(KINDS)}}} [LINE]", file=sys.stderr)
        return 2
    chosen = to_run(argv[0])
    if len(argv) == 1:
        for b in chosen:
            print(f"{b.line}\t{b.commands[0] if b.commands else ''}")
        return 0
    block = next((b for b in chosen if str(b.line) == argv[1]), None)
    if block is None:
        print(f"readme_blocks.py: no {argv[0]} block starts at line {argv[1]}", file=sys.stderr)
        return 2
    sys.stdout.write(block.code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
