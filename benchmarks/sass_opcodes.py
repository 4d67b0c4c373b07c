"""Static opcode mix of the kernels in a compiled extension (reads ``cuobjdump -sass``).

Usage: ``cuobjdump -sass gpucheck/_C*.so | python benchmarks/sass_opcodes.py [NAME_REGEX]``:
for each kernel whose mangled name matches, the instruction count and the most frequent
opcodes (without modifiers), to see where a kernel's instructions go (e.g. FFMA vs address
arithmetic vs shared loads). Static counts: a loop body is counted once.
"""

from __future__ import annotations

import collections
import re
import sys


def main() -> int:
    pattern = re.compile(sys.argv[1] if len(sys.argv) > 1 else ".")
    kernels: dict[str, collections.Counter[str]] = {}
    current: collections.Counter[str] | None = None
    for line in sys.stdin:
        if "Function :" in line:
            name = line.split("Function :", 1)[1].strip()
            current = (
                kernels.setdefault(name, collections.Counter()) if pattern.search(name) else None
            )
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if current is not None and m:
            current[m.group(1)] += 1
    for name, ops in kernels.items():
        total = sum(ops.values())
        top = ", ".join(f"{op} {n}" for op, n in ops.most_common(14))
        print(f"{name[:90]}: {total} instructions; {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
