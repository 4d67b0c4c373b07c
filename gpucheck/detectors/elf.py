"""Just enough of ELF to tell a compiled torch extension and to find a kernel's library.

Two questions, both answered from the file's section headers with :mod:`struct` (no
``ctypes``, no ``readelf``, nothing loaded):

- :func:`needed`: the shared libraries a file links (``DT_NEEDED`` of its ``.dynamic``
  section). A Python extension module that links ``libc10`` or ``libtorch*`` is a compiled
  torch extension (:func:`links_torch`).
- :func:`defines`: whether a file's symbol names (``.symtab``, or ``.dynsym`` where the file
  was stripped) hold a qualified name. A CUDA kernel ``__global__ void k(...)`` leaves a host
  stub whose mangled name holds its qualified name as ``<length><component>`` tokens
  (``_ZN2ns12_GLOBAL__N_18k_kernelEPf`` for ``ns::(anonymous namespace)::k_kernel``; nvcc
  names an anonymous namespace ``<length>_GLOBAL__N__<hash>_<file>``), so the
  library that launched a kernel the profiler names is the library whose names hold that
  kernel's qualified name (:func:`name_path`).

A file without section headers (rare: a hand-stripped library) is read as linking nothing
and defining nothing.
"""

from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass
from typing import BinaryIO

SHT_SYMTAB = 2
SHT_STRTAB = 3
SHT_DYNAMIC = 6
SHT_DYNSYM = 11
DT_NEEDED = 1
#: libraries whose presence in DT_NEEDED makes an extension module a torch extension
TORCH_LIBS = ("libc10", "libtorch")


@dataclass(frozen=True)
class Section:
    kind: int
    offset: int
    size: int
    link: int


def _sections(data: bytes, f: BinaryIO) -> tuple[str, list[Section]] | None:
    """(struct byte order, sections) from an ELF header; None when not ELF."""
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return None
    is64, order = data[4] == 2, "<" if data[5] == 1 else ">"
    if is64:
        (shoff,) = struct.unpack_from(order + "Q", data, 0x28)
        entsize, count = struct.unpack_from(order + "HH", data, 0x3A)
        fmt = order + "IIQQQQIIQQ"
    else:
        (shoff,) = struct.unpack_from(order + "I", data, 0x20)
        entsize, count = struct.unpack_from(order + "HH", data, 0x2E)
        fmt = order + "IIIIIIIIII"
    if not shoff or not count or entsize < struct.calcsize(fmt):
        return None
    f.seek(shoff)
    table = f.read(entsize * count)
    found = []
    for i in range(min(count, len(table) // entsize)):
        _, kind, _, _, offset, size, link, *_ = struct.unpack_from(fmt, table, i * entsize)
        found.append(Section(kind, offset, size, link))
    return order + ("Q" if is64 else "I"), found


def _read(f: BinaryIO, s: Section) -> bytes:
    f.seek(s.offset)
    return f.read(s.size)


@functools.lru_cache(maxsize=1024)
def needed(path: str) -> tuple[str, ...]:
    """The ``DT_NEEDED`` entries of the ELF file ``path`` (empty: not ELF, unreadable, or
    linking nothing)."""
    try:
        with open(path, "rb") as f:
            parsed = _sections(f.read(64), f)
            if parsed is None:
                return ()
            word, sections = parsed
            out: list[str] = []
            for s in sections:
                if s.kind != SHT_DYNAMIC or not 0 <= s.link < len(sections):
                    continue
                dyn, names = _read(f, s), _read(f, sections[s.link])
                step = 2 * struct.calcsize(word)
                for i in range(0, len(dyn) - step + 1, step):
                    tag, value = struct.unpack_from(word[0] + word[1] * 2, dyn, i)
                    if tag == 0:
                        break
                    if tag == DT_NEEDED and value < len(names):
                        out.append(
                            names[value : names.index(b"\0", value)].decode(errors="replace")
                        )
            return tuple(out)
    except (OSError, struct.error, ValueError):
        return ()


def links_torch(path: str) -> bool:
    """Whether ``path`` links libc10 or libtorch (a compiled torch extension)."""
    return any(lib.startswith(TORCH_LIBS) for lib in needed(path))


@functools.lru_cache(maxsize=256)
def symbol_names(path: str) -> bytes:
    """The symbol names of ``path`` (its ``.symtab``'s string table, else ``.dynsym``'s),
    NUL-separated; empty when it has none."""
    try:
        with open(path, "rb") as f:
            parsed = _sections(f.read(64), f)
            if parsed is None:
                return b""
            _, sections = parsed
            for kind in (SHT_SYMTAB, SHT_DYNSYM):
                tables = [s for s in sections if s.kind == kind and 0 <= s.link < len(sections)]
                if tables:
                    return b"\0".join(
                        _read(f, sections[s.link])
                        for s in tables
                        if sections[s.link].kind == SHT_STRTAB
                    )
    except (OSError, struct.error):
        return b""
    return b""


def defines(path: str, name: list[str] | str) -> bool:
    """Whether a symbol name of ``path`` holds the qualified name ``name`` (:func:`matches`)."""
    return matches(symbol_names(path), name)


def matches(names: bytes, name: list[str] | str) -> bool:
    """Whether NUL-separated symbol ``names`` hold the qualified name ``name`` (its components,
    :func:`name_path`) mangled: ``<length><component>`` for each in a row, not preceded by a
    digit (the lengths make the match exact). An anonymous namespace is any
    ``<length>_GLOBAL__N_...`` (``12_GLOBAL__N_1`` from gcc, a name unique to the file from
    nvcc). A mangled name (``_Z...``) must be one of the names itself."""
    if not names or not name:
        return False
    if isinstance(name, str):
        return (b"\0" + name.encode() + b"\0") in b"\0" + names + b"\0"
    parts = [
        rb"\d+_GLOBAL__N_[0-9A-Za-z_]*?"
        if c == ANON_MANGLED
        else re.escape(f"{len(c)}{c}".encode())
        for c in name
    ]
    return re.search(rb"(?<![0-9])" + b"".join(parts), names) is not None


ANON = "(anonymous namespace)"
ANON_MANGLED = "_GLOBAL__N_1"


def name_path(kernel: str) -> list[str] | str:
    """The qualified name of a kernel as the profiler names it, as components without
    template arguments (``void ns::(anonymous namespace)::k<float, 4>(float const*)`` ->
    ``["ns", "_GLOBAL__N_1", "k"]``); a mangled name (``_Z...``) is returned as it is."""
    name = kernel.strip()
    if name.startswith("_Z"):
        return name.split("(")[0]
    depth, plain = 0, []
    i = 0
    while i < len(name):
        ch = name[i]
        if name.startswith(ANON, i):  # its parentheses are not the argument list
            if depth == 0:
                plain.append(ANON_MANGLED)
            i += len(ANON)
            continue
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            break  # the argument list
        elif depth == 0:
            plain.append(ch)
        i += 1
    qualified = "".join(plain).strip().split(" ")[-1]  # drop the return type ("void ")
    return [c for c in qualified.split("::") if c]


def is_extension_file(path: str | None) -> bool:
    """Whether ``path`` names a shared library (a compiled extension module's file)."""
    return bool(path) and str(path).endswith((".so", ".pyd"))
