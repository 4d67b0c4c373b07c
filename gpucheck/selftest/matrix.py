"""The self-test's defect x detector matrix: the planted defects (``DEFECTS``), the clean cases
(``CLEAN``), and whether each defect was found by the detector meant for it (right kind,
severity, device and op) and whether any clean case drew a finding (:func:`matrix`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpucheck.model.modes import try_parse
from gpucheck.model.results import CaseRecord, Finding

#: severities in increasing order; a finding at or above a row's severity names its defect
SEVERITIES = ("info", "warning", "error")
SANITIZER = "sanitizer:"


@dataclass(frozen=True)
class Defect:
    """One planted defect and what must find it."""

    name: str
    case: str  # case id (relative to the selftest suite) without its device parameter
    kind: str  # the finding kind that must name it
    mode: str  # "plain" (the blocking/nvml pass) or "sanitizer:<tool>" (that tool's passes)
    min_devices: int = 1
    op: str | None = None  # a substring the finding's op or kernel must contain
    severity: str = "error"  # the severity its detector emits that kind with (or higher)


_SSIM = "test_defect_ssim.py::"
_KNN = "test_defect_knn.py::"
_MEM = "test_defect_memory.py::"
_SPLAT = "test_defect_splat.py::"
_PYB = "test_defect_pybind.py::"
_CKR = "test_defect_checkpoint_read.py::"
DEFECTS = (
    Defect(
        "no device guard (pybind extension)",
        "test_selftest.py::test_unguarded_launch",
        "wrong-device",
        "plain",
        min_devices=2,
    ),
    Defect("abort inside the extension", "test_selftest.py::test_abort", "crash", "plain"),
    Defect(
        "out-of-bounds global write",
        "test_selftest.py::test_overrun",
        "sanitizer",
        "sanitizer:memcheck",
        op="add_one",
    ),
    Defect(
        "launch on the legacy default stream (SSIM)",
        "test_defect_stream.py::test_legacy_stream_ssim",
        "wrong-stream",
        "plain",
        op="ssim_forward",
    ),
    Defect(
        "no device guard (SSIM)",
        _SSIM + "test_no_guard_ssim",
        "wrong-device",
        "plain",
        min_devices=2,
        op="ssim_forward",
    ),
    Defect(
        "out-of-range shared-memory write (SSIM forward)",
        _SSIM + "test_shared_oob_ssim",
        "sanitizer",
        "sanitizer:memcheck",
        op="ssim",
    ),
    Defect(
        "missing __syncthreads (SSIM backward)",
        _SSIM + "test_no_sync_ssim",
        "sanitizer",
        "sanitizer:racecheck",
        op="ssim",
    ),
    Defect(
        "no device guard (KNN)",
        _KNN + "test_no_guard_knn",
        "wrong-device",
        "plain",
        min_devices=2,
        op="knn_mean_sq_dist",
    ),
    Defect(
        "bare cudaSetDevice (KNN)",
        _KNN + "test_set_device_knn",
        "device-state-leak",
        "plain",
        min_devices=2,
        op="knn_mean_sq_dist",
        severity="warning",
    ),
    Defect(
        "output on the current device (KNN)",
        _KNN + "test_output_current_device_knn",
        "wrong-device",
        "plain",
        min_devices=2,
        op="knn_mean_sq_dist",
    ),
    Defect(
        "read of uninitialized memory (KNN)",
        _KNN + "test_uninit_read_knn",
        "sanitizer",
        "sanitizer:initcheck",
        op="query",
    ),
    Defect(
        "result differs between runs (KNN)",
        _KNN + "test_nondeterminism_knn",
        "numerics",
        "plain",
        op="knn_mean_sq_dist",
    ),
    Defect(
        "raw cudaMalloc per call, never freed", _MEM + "test_leak_raw_cudamalloc", "leak", "plain"
    ),
    Defect("tensors kept across calls", _MEM + "test_leak_kept_tensors", "leak", "plain"),
    Defect(
        "scratch buffer quadratic in the size",
        _MEM + "test_growth_quadratic",
        "memory-growth",
        "plain",
        severity="warning",
    ),
    Defect(
        "checkpoint saved activated, loaded as raw",
        _MEM + "test_double_activation_loader",
        "double-activation",
        "plain",
        min_devices=0,
    ),  # CPU only: runs without a GPU
    Defect(
        "checkpoint saved activated, rendered after a 3DGS load",
        _MEM + "test_double_activation_render",
        "oom-anomaly",
        "plain",
    ),
    Defect(
        "checkpoint saved activated, read the 3DGS way and rendered (fits in memory)",
        _CKR + "test_activated_checkpoint_rendered",
        "double-activation",
        "plain",
    ),
    Defect(
        "checkpoint saved activated, read the 3DGS way",
        _CKR + "test_activated_checkpoint_read",
        "double-activation",
        "plain",
        min_devices=0,
    ),
    Defect(
        "binning buffers on the current device (splat)",
        _SPLAT + "test_buffers_current_device_splat",
        "wrong-device",
        "plain",
        min_devices=2,
        op="splat_project",
    ),
    Defect(
        "forward on the legacy default stream (pybind)",
        _PYB + "test_legacy_stream_pybind",
        "wrong-stream",
        "plain",
        op="gpucheck_pybind_legacy_stream.scale_forward",
    ),
    Defect(
        "cub on stream 0 in backward (pybind)",
        _PYB + "test_cub_stream0_pybind",
        "wrong-stream",
        "plain",
        op="gpucheck_pybind_cub_stream0.scale_backward",
    ),
    Defect(
        "output on the current device (pybind)",
        _PYB + "test_output_current_device_pybind",
        "wrong-device",
        "plain",
        min_devices=2,
        op="gpucheck_pybind_output_current_device.scale_forward",
    ),
    Defect(
        "bare cudaSetDevice (pybind)",
        _PYB + "test_set_device_pybind",
        "device-state-leak",
        "plain",
        min_devices=2,
        op="gpucheck_pybind_set_device.scale_forward",
        severity="warning",
    ),
    Defect(
        "kernel on stream 0 from an unwatched caller (ctypes)",
        _PYB + "test_unwatched_caller_pybind",
        "wrong-stream",
        "plain",
        op="scale_kernel",
    ),
    Defect(
        "CPU tensor among CUDA arguments (pybind)",
        _PYB + "test_cpu_argument_pybind",
        "mixed-devices",
        "plain",
        op="gpucheck_pybind_clean.shade",
    ),
)
#: the sanitizer passes of ``gpucheck selftest --sanitizer``: every tool a row needs
#: cases of correct code: any finding of severity error or warning on them is a false positive
CLEAN = (
    "test_selftest.py::test_good_guarded",
    "test_selftest.py::test_good_after_the_defects",
    "test_defect_stream.py::test_clean_ssim",
    _SSIM + "test_clean_ssim",
    _KNN + "test_clean_knn",
    _MEM + "test_clean_repeat",
    _MEM + "test_growth_linear_clean",
    _MEM + "test_clean_roundtrip",
    _MEM + "test_clean_render",
    _SPLAT + "test_clean_splat",
    _CKR + "test_raw_checkpoint_rendered",
    _CKR + "test_raw_checkpoint_read",
    _PYB + "test_clean_pybind",
    _PYB + "test_clean_unwatched_caller_pybind",
)


def base_case(case: str) -> str:
    return case.split("[", 1)[0]


def pass_of(mode: str) -> str | None:
    """The row mode a record's mode belongs to: ``blocking+nvml`` -> ``plain``;
    ``sanitizer:racecheck`` and ``sanitizer:racecheck|target-current`` ->
    ``sanitizer:racecheck`` (a bare ``sanitizer`` is memcheck); None for the re-runs of the
    wrong-device check (``|rerun:target-current``), which are evidence, not passes."""
    parsed = try_parse(mode)
    if parsed is None or parsed.rerun:
        return None
    tool = parsed.sanitizer_tool
    return SANITIZER + tool if tool else "plain"


def rank(severity: Any) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else -1


@dataclass
class Row:
    defect: Defect
    status: str  # "found", "missed", "not run"
    detail: str


def names_defect(d: Defect, r: CaseRecord, f: Finding) -> bool:
    """Whether finding ``f`` of record ``r`` is the one meant for defect ``d``."""
    return (
        f.kind == d.kind
        and rank(f.severity) >= rank(d.severity)
        and f.device in (None, r.device)
        and (d.op is None or d.op in f"{f.op or ''} {f.kernel or ''}")
    )


def _row(d: Defect, recs: list[CaseRecord], devices: int, passes: set[str]) -> Row:
    if devices < d.min_devices:
        return Row(d, "not run", f"needs {d.min_devices} GPUs")
    if d.mode not in passes:
        return Row(
            d,
            "not run",
            f"no {d.mode} pass in this run"
            + (" (gpucheck selftest --sanitizer)" if d.mode.startswith(SANITIZER) else ""),
        )
    mine = [r for r in recs if base_case(r.case) == d.case and pass_of(r.mode) == d.mode]
    ran = sorted({(r.device, r.mode) for r in mine if r.status != "skipped"})
    if not ran:
        return Row(d, "not run", "its case did not run in this mode")
    hits = [(r, f) for r in mine for f in r.findings if names_defect(d, r, f)]
    hit = {(r.device, r.mode) for r, _ in hits}
    devices_hit = sorted({dev for dev, _ in hit})
    if all(key in hit for key in ran):
        f = hits[0][1]
        what = f.op or f.kernel or ""
        return Row(
            d, "found", f"{d.kind} on {', '.join(devices_hit)}{' · ' + what if what else ''}"
        )
    missed = [f"{dev} ({mode})" for dev, mode in ran if (dev, mode) not in hit]
    seen = sorted(
        {
            f"{f.kind}/{f.severity}" + (f" op={f.op or f.kernel}" if f.kind == d.kind else "")
            for r in mine
            for f in r.findings
        }
    )
    return Row(
        d, "missed", f"not found on {', '.join(missed)}; findings seen: {', '.join(seen) or 'none'}"
    )


def matrix(records: Iterable[CaseRecord], devices: int) -> tuple[list[Row], list[dict[str, Any]]]:
    """The matrix rows and the false positives, from the case records of a selftest run,
    their diagnoses attached (``devices``: how many GPUs the run had).

    A row is found when, on every (device, pass) where its case ran — for a sanitizer tool
    both ``sanitizer:<tool>`` and ``sanitizer:<tool>|target-current`` —, a record of the case
    carries a finding of the row's kind, at least its severity, on that device, whose op or
    kernel contains the row's ``op``."""
    recs = list(records)
    passes = {m for r in recs if (m := pass_of(r.mode)) is not None}
    rows = [_row(d, recs, devices, passes) for d in DEFECTS]
    false = [
        {"device": r.device, "case": r.case, "mode": r.mode, "kind": f.kind, "message": f.message}
        for r in recs
        if base_case(r.case) in CLEAN
        for f in r.findings
        if f.severity in ("error", "warning")
    ]
    return rows, false
