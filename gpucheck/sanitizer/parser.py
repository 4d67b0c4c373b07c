"""Parse compute-sanitizer's text output (``--log-file``) into findings.

The log interleaves the tool's lines (prefixed ``========= ``) with the program's own output.
A record starts with an unindented tool line (``Invalid __global__ read of size 4 bytes``,
``Error: Race reported between ...``, ``Program hit ...``) and continues with indented lines
(``at KERNEL+0xOFF``, ``by thread (x,y,z) in block (x,y,z)``, ``Access to 0x... is out of
bounds``, host frames) until a blank tool line. Wording of older releases (``Address 0x...``,
``at 0xOFF in FILE:LINE:KERNEL``) is accepted too. Identical records (same error, kernel,
offset and source line) are folded into one finding with a count.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gpucheck._resources import user_code

PREFIX = re.compile(r"^={9}(?: |$)")
TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")

# --- first lines of a record -------------------------------------------------------------------
ACCESS = re.compile(
    r"^(?P<what>Invalid|Misaligned|Out-of-range) (?:__(?P<space>\w+?)__ )?"
    r"(?P<access>read|write|atomic|access)\w* of size (?P<size>\d+) bytes?",
    re.I,
)
UNINIT = re.compile(
    r"^Uninitialized (?:__(?P<space>\w+?)__ )?memory (?P<access>read|write)\w*"
    r"(?: of size (?P<size>\d+) bytes?)?",
    re.I,
)
RACE = re.compile(
    r"^(?P<level>Error|Warning): Race reported between (?P<a1>\w+) access at "
    r"(?P<loc>.+?)(?: \[(?P<n>\d+) hazards?\])?$"
)
RACE_MORE = re.compile(r"^and (?P<a2>\w+) access at (?P<loc>.+?)(?: \[(?P<n>\d+) hazards?\])?$")
BARRIER = re.compile(r"^Barrier error detected\.?\s*(?P<detail>.*)$", re.I)
API = re.compile(
    r"^Program hit (?P<err>\w+) \(error (?P<code>\d+)\) due to \"(?P<why>[^\"]*)\""
    r"(?: on CUDA API call to (?P<call>\w+))?"
)
LEAK = re.compile(r"^Leaked (?P<size>\d+) bytes? at (?P<addr>0x[0-9a-fA-F]+)")
# --- continuation lines ------------------------------------------------------------------------
AT_NEW = re.compile(r"^at (?P<kernel>.+?)\+(?P<off>0x[0-9a-fA-F]+)(?: in (?P<src>\S+:\d+))?$")
AT_OLD = re.compile(r"^at (?P<off>0x[0-9a-fA-F]+) in (?:(?P<src>\S+?:\d+):)?(?P<kernel>.+)$")
THREAD = re.compile(r"^by thread \((?P<t>[\d, ]+)\) in block \((?P<b>[\d, ]+)\)")
ADDRESS = re.compile(r"^(?:Access to|Address) (?P<addr>0x[0-9a-fA-F]+)\s*(?P<rest>.*)$")
RELATION = re.compile(r"^and is (?P<rel>.+)$")
HOST = re.compile(r"^Host Frame:\s*(?P<frame>.*)$")
DEVICE = re.compile(r"^Device Frame:\s*(?P<frame>.*)$")
PY_FRAME = re.compile(r" in (?P<where>\S+\.py:\d+)\s*$")
SRC_IN_FRAME = re.compile(r" in (?P<src>\S+\.(?:cu|cuh|h|hpp|cpp|cc):\d+)\s*$")
DEVICE_FN = re.compile(r"^(?P<fn>.+?)\+0x[0-9a-fA-F]+(?: in \S+)?$")
HEADER = (".h", ".hpp", ".cuh")
# --- summaries ---------------------------------------------------------------------------------
ERR_SUMMARY = re.compile(r"^ERROR SUMMARY: (?P<n>[\d,]+) errors?\s*$")
NOT_PRINTED = re.compile(r"^ERROR SUMMARY: (?P<n>[\d,]+) errors? w(?:ere|as) not printed")
RACE_SUMMARY = re.compile(
    r"^RACECHECK SUMMARY: (?P<n>[\d,]+) hazards? displayed "
    r"\((?P<e>[\d,]+) errors?, (?P<w>[\d,]+) warnings?\)"
)
LEAK_SUMMARY = re.compile(r"^LEAK SUMMARY: (?P<bytes>[\d,]+) bytes? leaked in (?P<n>[\d,]+)")
IGNORED = (
    "COMPUTE-SANITIZER",
    "CUDA-MEMCHECK",
    "Target application returned an error",
    "Process ID:",
    "Saved host backtrace",
    "This run has",
    "No host backtrace",
)


@dataclass
class SanitizerFinding:
    """One compute-sanitizer error record (or several identical ones, see ``count``)."""

    tool: str
    severity: str
    error: str
    kind: str = "sanitizer"
    access: str | None = None
    space: str | None = None
    size: int | None = None
    kernel: str | None = None
    kernel_name: str | None = None
    offset: str | None = None
    thread: str | None = None
    block: str | None = None
    address: str | None = None
    address_relation: str | None = None
    host_frames: list[str] = field(default_factory=list)
    device_frames: list[str] = field(default_factory=list)
    python_frame: str | None = None  # the first Python frame outside gpucheck and torch
    python_frames: list[str] = field(default_factory=list)  # every one, innermost first
    source: str | None = None
    api_call: str | None = None
    hazards: int | None = None
    count: int = 1
    lines: list[str] = field(default_factory=list, repr=False)

    def key(self) -> tuple[Any, ...]:
        return (
            self.tool,
            self.error,
            self.kernel,
            self.offset,
            self.source,
            self.api_call,
            self.access,
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("lines")
        return data


@dataclass
class SanitizerReport:
    tool: str | None
    errors_reported: int | None  # the tool's own count (ERROR / RACECHECK SUMMARY)
    errors_printed: int  # records in the log, before folding
    errors_not_printed: int
    findings: list[SanitizerFinding]
    summary_seen: bool
    target_failed: bool  # "Target application returned an error"
    leaked_bytes: int | None = None

    @property
    def clean(self) -> bool:
        return self.summary_seen and not self.findings and not self.errors_reported

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "errors_reported": self.errors_reported,
            "errors_printed": self.errors_printed,
            "errors_not_printed": self.errors_not_printed,
            "summary_seen": self.summary_seen,
            "target_failed": self.target_failed,
            "leaked_bytes": self.leaked_bytes,
            "findings": [f.to_json() for f in self.findings],
        }


def kernel_name(signature: str) -> str:
    """``void ns::k<float, 2>(const float *, int)`` -> ``ns::k<float, 2>`` (a member function's
    trailing ``const`` goes too)."""
    sig = signature.strip()
    sig = re.sub(r"\)\s*(const|volatile|&&?|\s)+$", ")", sig)
    if sig.endswith(")"):
        depth = 0
        for i in range(len(sig) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(sig[i], 0)
            if depth == 0:
                sig = sig[:i]
                break
    depth, cut = 0, 0
    for i, ch in enumerate(sig):  # drop a return type: the last space outside <...>
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == " " and depth == 0:
            cut = i + 1
    return sig[cut:].strip()


def _num(text: str) -> int:
    return int(text.replace(",", ""))


def _tuple(text: str) -> str:
    return "(" + ",".join(p.strip() for p in text.split(",")) + ")"


def _start(line: str, tool: str | None) -> SanitizerFinding:
    """A finding from the first line of a record."""
    if m := ACCESS.match(line):
        space = m["space"] or ("shared or local" if "Shared or Local" in line else None)
        return SanitizerFinding(
            tool or "memcheck",
            "error",
            line,
            access=m["access"].lower(),
            space=space,
            size=int(m["size"]),
        )
    if m := UNINIT.match(line):
        return SanitizerFinding(
            tool or "initcheck",
            "error",
            line,
            access=m["access"].lower(),
            space=m["space"] or "global",
            size=int(m["size"]) if m["size"] else None,
        )
    if m := RACE.match(line):
        f = SanitizerFinding(
            tool or "racecheck",
            "error" if m["level"] == "Error" else "warning",
            line,
            access=m["a1"].lower(),
            space="shared",
            hazards=int(m["n"]) if m["n"] else None,
        )
        _location(f, m["loc"])
        return f
    if m := BARRIER.match(line):
        return SanitizerFinding(tool or "synccheck", "error", line, access="barrier")
    if m := API.match(line):
        return SanitizerFinding(tool or "memcheck", "error", line, access="api", api_call=m["call"])
    if m := LEAK.match(line):
        return SanitizerFinding(
            tool or "memcheck",
            "warning",
            line,
            access="leak",
            size=int(m["size"]),
            address=m["addr"],
        )
    if line.startswith("Error: process didn't terminate"):
        return SanitizerFinding(tool or "memcheck", "error", line, access="process")
    return SanitizerFinding(tool or "memcheck", "error", line)


def _location(f: SanitizerFinding, loc: str) -> None:
    """``KERNEL+0xOFF [in FILE:LINE]`` or ``0xOFF in [FILE:LINE:]KERNEL``."""
    m = AT_NEW.match("at " + loc) or AT_OLD.match("at " + loc)
    if m:
        f.kernel, f.offset = m["kernel"].strip(), m["off"]
        f.kernel_name = kernel_name(f.kernel)
        f.source = f.source or m["src"]


def _continue(f: SanitizerFinding, line: str) -> None:
    body = line.strip()
    if m := RACE_MORE.match(body):
        f.access = f"{f.access}/{m['a2'].lower()}"
        if m["n"]:
            f.hazards = (f.hazards or 0) + int(m["n"])
    elif body.startswith("at ") and f.kernel is None:
        _location(f, body[3:])
    elif m := THREAD.match(body):
        f.thread, f.block = _tuple(m["t"]), _tuple(m["b"])
    elif m := ADDRESS.match(body):
        f.address = m["addr"]
        if m["rest"] and f.address_relation is None:
            f.address_relation = m["rest"]
    elif m := RELATION.match(body):
        f.address_relation = m["rel"]
    elif m := HOST.match(body):
        frame = m["frame"].strip()
        f.host_frames.append(frame)
        if p := PY_FRAME.search(frame):
            # the call site is the first frame in the user's code, not gpucheck's wrapper of
            # the extension's function (the innermost frame when every one is ours)
            f.python_frames.append(p["where"])
            f.python_frame = next((w for w in f.python_frames if user_code(w)), f.python_frames[0])
    elif m := DEVICE.match(body):
        # the fault was inlined into a kernel: the last device frame is the kernel, and the
        # first source line outside a header is the user's code
        frame = m["frame"].strip()
        f.device_frames.append(frame)
        if fn := DEVICE_FN.match(frame):
            f.kernel = fn["fn"].strip()
            f.kernel_name = kernel_name(f.kernel)
        if (s := SRC_IN_FRAME.search(frame)) and (
            f.source is None or f.source.split(":")[0].endswith(HEADER)
        ):
            f.source = s["src"]


def detect_tool(text: str) -> str | None:
    if "RACECHECK SUMMARY" in text or "Race reported between" in text:
        return "racecheck"
    if "Uninitialized __" in text or re.search(r"Uninitialized \w+ memory", text):
        return "initcheck"
    if "Barrier error" in text:
        return "synccheck"
    if "COMPUTE-SANITIZER" in text or "ERROR SUMMARY" in text:
        return "memcheck"
    return None


@dataclass
class _Scan:
    """One pass over a log: its records (unfolded) with the byte offset of each in the text,
    and its summary lines."""

    records: list[tuple[int, SanitizerFinding]] = field(default_factory=list)
    reported: int | None = None
    not_printed: int = 0
    summary: bool = False
    target_failed: bool = False
    leaked: int | None = None
    current: SanitizerFinding | None = None  # the record the next indented line continues

    def line(self, line: str, start: int, tool: str | None) -> None:
        """One of the tool's lines, without its ``========= `` prefix (``start``: the byte
        offset of the line in the text)."""
        if not line.strip():
            self.current = None
            return
        if line[0] == " ":
            if self.current is not None:
                self.current.lines.append(line)
                _continue(self.current, line)
            return
        self.current = None
        if m := NOT_PRINTED.match(line):
            self.not_printed = _num(m["n"])
            self.summary = True
        elif m := ERR_SUMMARY.match(line):
            n = _num(m["n"])
            self.reported = n if self.reported is None else max(self.reported, n)
            self.summary = True
        elif m := RACE_SUMMARY.match(line):
            self.reported = _num(m["e"]) + _num(m["w"])
            self.summary = True
        elif m := LEAK_SUMMARY.match(line):
            self.leaked = _num(m["bytes"])
        elif line.startswith("Target application returned an error"):
            self.target_failed = True
        elif not line.startswith(IGNORED):
            self.current = _start(line, tool)
            self.current.lines.append(line)
            self.records.append((start, self.current))


def _scan(text: str, tool: str | None) -> _Scan:
    scan = _Scan()
    at = 0  # bytes of the text before the line
    for raw in text.splitlines(keepends=True):
        start, at = at, at + len(raw.encode(errors="replace"))
        raw = raw.rstrip("\r\n")
        if PREFIX.match(raw):  # else the program's own output
            scan.line(raw[10:].rstrip() if len(raw) > 9 else "", start, tool)
    return scan


def parse_record(lines: list[str], tool: str | None = None) -> SanitizerFinding | None:
    """One record as a finding keeps it (:func:`gpucheck.sanitizer.findings.read_back`): its
    lines without the ``========= `` prefix, the first one unindented. None: no record."""
    scan = _Scan()
    tool = tool or detect_tool("\n".join(lines))
    for line in lines:
        scan.line(line.rstrip(), 0, tool)
    return scan.records[0][1] if scan.records else None


def placed(text: str, tool: str | None = None) -> list[tuple[int, SanitizerFinding]]:
    """Every record of a slice of a log, unfolded, with the byte offset of its first line in
    the slice (where the tool wrote it: :mod:`gpucheck.sanitizer.tracing` places it among the
    calls of the case)."""
    return _scan(text, tool or detect_tool(text)).records


def fold(records: list[SanitizerFinding]) -> list[SanitizerFinding]:
    """Identical records (same error, kernel, offset and source line) as one, with a count."""
    folded: dict[tuple[Any, ...], SanitizerFinding] = {}
    for rec in records:
        if rec.key() in folded:
            folded[rec.key()].count += rec.count
        else:
            folded[rec.key()] = replace(rec)  # a copy: the records given keep their counts
    return list(folded.values())


def printed(records: list[SanitizerFinding]) -> int:
    """How many of the records count against the tool's ``--print-limit``."""
    return sum(r.count for r in records if r.access != "process")


def parse(text: str, tool: str | None = None) -> SanitizerReport:
    """Parse a whole log. ``tool`` overrides what the log's content suggests."""
    tool = tool or detect_tool(text)
    scan = _scan(text, tool)
    records = [r for _, r in scan.records]
    return SanitizerReport(
        tool,
        scan.reported,
        printed(records),
        scan.not_printed,
        fold(records),
        scan.summary,
        scan.target_failed,
        scan.leaked,
    )


def parse_file(path: Path | str, tool: str | None = None) -> SanitizerReport:
    return parse(Path(path).read_text(errors="replace"), tool)
