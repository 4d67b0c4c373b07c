"""Static opcode mix of the kernels in a compiled extension (reads ``cuobjdump -sass``).

Usage: ``cuobjdump -sass gpucheck/_C*.so | python benchmarks/sass_opcodes.py [NAME_REGEX]``:
for each kernel whose mangled name matches, the instruction count and the most frequent
opcodes (without modifiers), to see where a kernel's instructions go (e.g. FFMA vs address
arithmetic vs shared loads). Static counts: a loop body is counted once. ``--loops``: also each
innermost loop of the kernel (a branch back to an earlier address whose body holds no other
such loop): its address range, its instruction count (every instruction of the body, i.e. an
iteration that takes every branch into the body) and its opcode mix.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(.*)")
BACKWARD = re.compile(r"\bBRA\s+(?:!?U?P\w+,\s*)?(0x[0-9a-f]+)")


def innermost_loops(code: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """(first, last) addresses of the loops of ``code`` ((address, opcode, operands) in
    address order) that contain no other loop."""
    loops = []
    for addr, op, rest in code:
        m = BACKWARD.search(op + rest)
        if op == "BRA" and m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    return [a for a in loops if not any(b != a and a[0] <= b[0] and b[1] <= a[1] for b in loops)]


def mix(ops: collections.Counter[str], n: int = 14) -> str:
    return ", ".join(f"{op} {k}" for op, k in ops.most_common(n))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pattern", nargs="?", default=".", help="kernel name regex")
    parser.add_argument("--loops", action="store_true", help="also each innermost loop")
    args = parser.parse_args()
    pattern = re.compile(args.pattern)
    kernels: dict[str, list[tuple[int, str, str]]] = {}
    current: list[tuple[int, str, str]] | None = None
    for line in sys.stdin:
        if "Function :" in line:
            name = line.split("Function :", 1)[1].strip()
            current = kernels.setdefault(name, []) if pattern.search(name) else None
            continue
        m = INSTRUCTION.match(line)
        if current is not None and m:
            current.append((int(m.group(1), 16), m.group(2), m.group(3)))
    for name, code in kernels.items():
        ops = collections.Counter(op for _, op, _ in code)
        print(f"{name[:90]}: {len(code)} instructions; {mix(ops)}")
        if not args.loops:
            continue
        for first, last in innermost_loops(code):
            body = collections.Counter(op for addr, op, _ in code if first <= addr <= last)
            total = sum(body.values())
            print(f"  loop {first:#06x}..{last:#06x}: {total} instructions; {mix(body, 10)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
