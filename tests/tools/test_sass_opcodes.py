"""benchmarks/sass_opcodes.py on recorded cuobjdump output: the opcode mix of a kernel and its
innermost loops (the splat forward's render kernel as compiled at 7e25b82)."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SASS = ROOT / "tests" / "fixtures" / "sass" / "render_kernel_sm90.sass.gz"


def run(*args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sass_opcodes.py"), *args],
        input=gzip.decompress(SASS.read_bytes()).decode(),
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines()


def test_opcode_mix() -> None:
    (line,) = run("render_kernel")
    assert ": 344 instructions; IMAD 47, BRA 28, FFMA 28," in line


def test_innermost_loop_only() -> None:
    """The kernel's batch loop holds the compositing loop: only the inner one is listed."""
    kernel, *loops = run("--loops", "render_kernel")
    assert "344 instructions" in kernel
    assert loops == [
        "  loop 0x05e0..0x0950: 56 instructions; FMUL 11, IMAD 8, FFMA 8, FADD 7, BRA 4, LDS 3, "
        "FSETP 3, VIADD 2, BSSY 1, SHF 1"
    ]


def test_other_kernel_names_match_nothing() -> None:
    assert run("--loops", "render_backward") == []
