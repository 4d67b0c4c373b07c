"""``gpucheck selftest``: the harness over deliberately broken extensions, and a matrix of
defect × detector that says whether each defect was found by the detector meant for it
(right kind, device and op) and whether any clean case drew a finding.

The defects live in ``suites/selftest/``: a small pybind extension (no device guard, an
out-of-bounds write, an abort) and gpucheck's own SSIM built with
``-DGPUCHECK_DEFECT_LEGACY_STREAM`` (every launch on the legacy default stream). Rows that need
more GPUs or a mode that was not run are reported as not run, never as found.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucheck.report import results


@dataclass(frozen=True)
class Defect:
    """One planted defect and what must find it."""

    name: str
    case: str  # case id (relative to the selftest suite) without its device parameter
    kind: str  # the finding kind that must name it
    mode: str  # "plain" (blocking/nvml passes) or "sanitizer"
    min_devices: int = 1
    op: str | None = None  # a substring the finding's op or kernel must contain


DEFECTS = (
    Defect("no device guard (pybind extension)", "test_selftest.py::test_unguarded_launch",
           "wrong-device", "plain", min_devices=2),
    Defect("abort inside the extension", "test_selftest.py::test_abort", "crash", "plain"),
    Defect("out-of-bounds global write", "test_selftest.py::test_overrun", "sanitizer",
           "sanitizer", op="add_one"),
    Defect("launch on the legacy default stream (SSIM)",
           "test_defect_stream.py::test_legacy_stream_ssim", "wrong-stream", "plain",
           op="ssim_forward"),
)
#: cases of correct code: any finding of severity error or warning on them is a false positive
CLEAN = ("test_selftest.py::test_good_guarded", "test_selftest.py::test_good_after_the_defects",
         "test_defect_stream.py::test_clean_ssim")


def _base(case: str) -> str:
    return case.split("[", 1)[0]


def _mode_kind(mode: str) -> str:
    return "sanitizer" if mode.startswith("sanitizer") else "plain"


@dataclass
class Row:
    defect: Defect
    status: str  # "found", "missed", "not run"
    detail: str


def matrix(records: Iterable[dict[str, Any]], devices: int
           ) -> tuple[list[Row], list[dict[str, Any]]]:
    """The matrix rows and the false positives, from the case and diagnosis records of a
    selftest run (``devices``: how many GPUs the run had)."""
    recs = [r for r in records if r.get("record", "case") in ("case", "diagnosis")]
    rows = []
    for d in DEFECTS:
        mine = [r for r in recs if _base(str(r.get("case"))) == d.case
                and _mode_kind(str(r.get("mode"))) == d.mode and "|" not in str(r.get("mode"))]
        ran = [r for r in mine if r.get("record", "case") == "case" and r["status"] != "skipped"]
        if devices < d.min_devices or not ran:
            why = (f"needs {d.min_devices} GPUs" if devices < d.min_devices
                   else "its case did not run in this mode")
            rows.append(Row(d, "not run", why))
            continue
        hits = [(r, f) for r in mine for f in r.get("findings", [])
                if f.get("kind") == d.kind and f.get("severity") == "error"
                and f.get("device") in (None, r.get("device"))
                and (d.op is None or d.op in f"{f.get('op') or ''} {f.get('kernel') or ''}")]
        devices_ran = sorted({str(r["device"]) for r in ran})
        devices_hit = sorted({str(r["device"]) for r, _ in hits})
        if hits and devices_hit == devices_ran:
            f = hits[0][1]
            what = f.get("op") or f.get("kernel") or ""
            rows.append(Row(d, "found", f"{d.kind} on {', '.join(devices_hit)}"
                                        f"{' · ' + what if what else ''}"))
        else:
            seen = sorted({f.get("kind") for r in mine for f in r.get("findings", [])})
            rows.append(Row(d, "missed", f"found on {devices_hit or 'no device'} of "
                                         f"{devices_ran}; kinds seen: {seen or 'none'}"))
    false = [{"device": r.get("device"), "case": r.get("case"), "mode": r.get("mode"),
              "kind": f.get("kind"), "message": f.get("message")}
             for r in recs if _base(str(r.get("case"))) in CLEAN
             for f in r.get("findings", []) if f.get("severity") in ("error", "warning")]
    return rows, false


def read_run(run_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """Every case and diagnosis record of the run in ``run_dir`` and how many GPUs it
    targeted."""
    recs = list(results.read(run_dir / "results.jsonl"))
    header = next((r for r in recs if r.get("record") == "run"), {})
    gpus = [d for d in header.get("devices", []) if str(d.get("device")).startswith("cuda")]
    return [r for r in recs if r.get("record") in ("case", "diagnosis")], len(gpus)


def verdict(rows: list[Row], false: list[dict[str, Any]]) -> int:
    """0 every defect found and no false positive; 1 a defect missed or a false positive;
    2 complete otherwise but some rows could not run here (e.g. one GPU)."""
    if false or any(r.status == "missed" for r in rows):
        return 1
    return 2 if any(r.status == "not run" for r in rows) else 0
