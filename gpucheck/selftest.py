"""``gpucheck selftest``: the harness over deliberately broken extensions, and a matrix of
defect × detector that says whether each defect was found by the detector meant for it
(right kind, severity, device and op) and whether any clean case drew a finding.

The defects live in ``suites/selftest/``: a small pybind extension (no device guard, an
out-of-bounds write, an abort, a raw ``cudaMalloc`` never freed, a quadratic scratch
buffer), a pybind extension called from an ``autograd.Function`` built once per
``GPUCHECK_PYBIND_DEFECT_*`` macro (``gpucheck._csrc.pybind.PYBIND_DEFECTS``: stream 0 in forward,
cub on stream 0 in backward, output on the current device, a bare ``cudaSetDevice``; and
its clean build called through ``ctypes`` on stream 0 and given a CPU tensor), a checkpoint
writer that stores activated values, and gpucheck's own SSIM and KNN built with a
``GPUCHECK_DEFECT_*`` macro each (``gpucheck._csrc.defects.DEFECTS``). Rows that need
more GPUs or a pass that was not run (``sanitizer:<tool>``) are reported as not run, never as found.

The zoo (``suites/selftest/zoo/``, :data:`ZOO`) is judged apart: pybind11 extensions in the
shape of the field's code (a 3DGS rasterizer, a fused SSIM loss, simple-knn's distCUDA2, an
RWKV-style RNN), each called from a ``torch.autograd.Function`` and built clean and with up to
two defects at once (``gpucheck._csrc.zoo.ZOO_BUILDS``). Each row states every finding its cases
must draw; any other finding is unexpected (:func:`zoo_matrix`: recall and unexpected findings
per row).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucheck.model.layout import RunFolder
from gpucheck.model.modes import try_parse
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.model.runlog import RunLog
from gpucheck.report.groups import SYMPTOM_KINDS

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
SANITIZER_MODES = tuple(dict.fromkeys(d.mode for d in DEFECTS if d.mode.startswith(SANITIZER)))
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


def _base(case: str) -> str:
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


def _rank(severity: Any) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else -1


@dataclass
class Row:
    defect: Defect
    status: str  # "found", "missed", "not run"
    detail: str


def _names(d: Defect, r: CaseRecord, f: Finding) -> bool:
    """Whether finding ``f`` of record ``r`` is the one meant for defect ``d``."""
    return (
        f.kind == d.kind
        and _rank(f.severity) >= _rank(d.severity)
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
    mine = [r for r in recs if _base(r.case) == d.case and pass_of(r.mode) == d.mode]
    ran = sorted({(r.device, r.mode) for r in mine if r.status != "skipped"})
    if not ran:
        return Row(d, "not run", "its case did not run in this mode")
    hits = [(r, f) for r in mine for f in r.findings if _names(d, r, f)]
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
        if _base(r.case) in CLEAN
        for f in r.findings
        if f.severity in ("error", "warning")
    ]
    return rows, false


# --- the zoo: real-shaped extensions, several defects at once ------------------------------


@dataclass(frozen=True)
class Expect:
    """A finding a zoo case must draw (and the only kind of finding it may draw)."""

    kind: str
    case: str  # the case (relative to the selftest suite) without its parameters
    op: str | None = None  # a substring of the finding's op or kernel
    min_devices: int = 1
    mode: str = "plain"
    severity: str = "error"


@dataclass(frozen=True)
class ZooRow:
    """One build of a zoo extension (suites/selftest/zoo/) and its cases: what must be found
    there (``expected``; empty: a clean twin) and, implied, that nothing else may be."""

    name: str
    bugs: str  # the defects planted, in words ("" for a clean twin)
    cases: tuple[str, ...]  # case ids without parameters
    expected: tuple[Expect, ...] = ()


_ZR, _ZS, _ZK, _ZN = (
    "zoo/test_zoo_raster.py::",
    "zoo/test_zoo_ssim.py::",
    "zoo/test_zoo_knn.py::",
    "zoo/test_zoo_rnn.py::",
)
_M = "gpucheck_zoo_"  # the zoo builds' module names (gpucheck._csrc.zoo.module_name)


def _zoo_row(name: str, bugs: str, case: str, *expected: tuple[Any, ...]) -> ZooRow:
    """A row of one case: ``expected`` as (kind, op, min_devices[, severity])."""
    return ZooRow(
        name,
        bugs,
        (case,),
        tuple(
            Expect(kind, case, op, n, severity=rest[0] if rest else "error")
            for kind, op, n, *rest in expected
        ),
    )


ZOO = (
    ZooRow(
        "rasterizer, clean twin",
        "",
        tuple(
            _ZR + c
            for c in (
                "test_raster_clean_colors",
                "test_raster_clean_sh",
                "test_raster_clean_empty",
                "test_raster_clean_checkpoint",
                "test_raster_clean_repeat",
            )
        ),
    ),
    _zoo_row(
        "rasterizer: activated checkpoint rendered without a device guard",
        "no guard + activated checkpoint",
        _ZR + "test_raster_noguard_checkpoint",
        ("double-activation", None, 1),
        ("wrong-device", _M + "raster_noguard", 2),
    ),
    _zoo_row(
        "rasterizer: render on stream 0, backward leaks its cudaMalloc",
        "legacy stream + leak",
        _ZR + "test_raster_legacy_leak_repeat",
        ("wrong-stream", _M + "raster_legacy_leak.rasterize_gaussians", 1),
        ("leak", None, 1),
    ),
    _zoo_row(
        "rasterizer: activated checkpoint rendered on stream 0",
        "legacy stream + activated checkpoint",
        _ZR + "test_raster_legacy_checkpoint",
        ("wrong-stream", _M + "raster_legacy_leak.rasterize_gaussians", 1),
        ("double-activation", None, 1),
    ),
    _zoo_row(
        "rasterizer: cub sort on stream 0, image on the current device",
        "cub on stream 0 + output on the current device",
        _ZR + "test_raster_sort0_outdev",
        ("wrong-stream", _M + "raster_sort0_outdev.rasterize_gaussians", 1),
        ("wrong-device", _M + "raster_sort0_outdev", 2),
    ),
    ZooRow(
        "SSIM loss, clean twin", "", (_ZS + "test_ssim_clean_train", _ZS + "test_ssim_clean_eval")
    ),
    _zoo_row(
        "SSIM loss without a device guard (story 1)",
        "no guard",
        _ZS + "test_ssim_noguard_train",
        ("wrong-device", _M + "ssim_noguard", 2),
    ),
    _zoo_row(
        "SSIM loss in evaluation: map on the current device, kernel on stream 0",
        "output on the current device + legacy stream (+ placeholders)",
        _ZS + "test_ssim_outdev_legacy_eval",
        ("wrong-stream", _M + "ssim_outdev_legacy.fusedssim", 1),
        ("wrong-device", _M + "ssim_outdev_legacy", 2),
    ),
    ZooRow("distCUDA2, clean twin", "", (_ZK + "test_knn_clean", _ZK + "test_knn_clean_repeat")),
    _zoo_row(
        "distCUDA2 without a device guard (story 2)",
        "no guard",
        _ZK + "test_knn_noguard",
        ("wrong-device", _M + "knn_noguard", 2),
    ),
    _zoo_row(
        "distCUDA2 with the published fix (cudaSetDevice), thrust on stream 0",
        "bare cudaSetDevice + thrust on the default stream",
        _ZK + "test_knn_setdevice_thrust0",
        ("device-state-leak", _M + "knn_setdevice_thrust0", 2, "warning"),
        ("wrong-stream", _M + "knn_setdevice_thrust0.distCUDA2", 1),
    ),
    _zoo_row(
        "distCUDA2 without a device guard, thrust on stream 0 (story 2 as published)",
        "no guard + thrust on the default stream",
        _ZK + "test_knn_noguard_thrust0",
        ("wrong-device", _M + "knn_noguard_thrust0", 2),
        ("wrong-stream", _M + "knn_noguard_thrust0.distCUDA2", 1),
    ),
    ZooRow(
        "custom RNN, clean twin", "", (_ZN + "test_rnn_clean", _ZN + "test_rnn_clean_placeholder")
    ),
    _zoo_row(
        "custom RNN: both kernels on stream 0 (as RWKV's)",
        "legacy stream (2 ops)",
        _ZN + "test_rnn_legacy",
        ("wrong-stream", _M + "rnn_legacy.forward", 1),
        ("wrong-stream", _M + "rnn_legacy.backward", 1),
    ),
    _zoo_row(
        "custom RNN without a device guard, both kernels on stream 0",
        "no guard + legacy stream (2 ops)",
        _ZN + "test_rnn_noguard_legacy",
        ("wrong-device", _M + "rnn_noguard_legacy", 2),
        ("wrong-stream", _M + "rnn_noguard_legacy.forward", 1),
        ("wrong-stream", _M + "rnn_noguard_legacy.backward", 1),
    ),
    _zoo_row(
        "custom RNN: initial state on the CPU, kernels on stream 0",
        "CPU tensor argument + legacy stream (2 ops)",
        _ZN + "test_rnn_legacy_cpu_state",
        ("mixed-devices", _M + "rnn_legacy", 1),
        ("wrong-stream", _M + "rnn_legacy.forward", 1),
        ("wrong-stream", _M + "rnn_legacy.backward", 1),
    ),
)


@dataclass
class ZooResult:
    """A zoo row judged on a run: its expectations found, missed and not run (each with why),
    and the findings nothing expected."""

    row: ZooRow
    found: list[Expect]
    missed: list[tuple[Expect, str]]
    not_run: list[tuple[Expect, str]]
    unexpected: list[dict[str, Any]]
    ran: bool  # whether any case of the row ran

    @property
    def recall(self) -> tuple[int, int]:
        """(expected findings found, expected findings that could run here)."""
        return len(self.found), len(self.found) + len(self.missed)


def _matches_expect(e: Expect, r: CaseRecord, f: Finding) -> bool:
    """Whether finding ``f`` of record ``r`` is (or, without an op or kernel, may be) the
    one ``e`` expects: its kind, on the record's device, naming ``e.op`` when it names
    anything."""
    names = f"{f.op or ''} {f.kernel or ''}".strip()
    return (
        f.kind == e.kind
        and f.device in (None, r.device)
        and (e.op is None or not names or e.op in names)
    )


def _judge_zoo(row: ZooRow, recs: list[CaseRecord], devices: int, passes: set[str]) -> ZooResult:
    mine = [r for r in recs if _base(r.case) in row.cases and pass_of(r.mode) is not None]
    found: list[Expect] = []
    missed: list[tuple[Expect, str]] = []
    not_run: list[tuple[Expect, str]] = []
    for e in row.expected:
        if devices < e.min_devices:
            not_run.append((e, f"needs {e.min_devices} GPUs"))
            continue
        if e.mode not in passes:
            not_run.append((e, f"no {e.mode} pass in this run"))
            continue
        ran = [
            r
            for r in mine
            if _base(r.case) == e.case and pass_of(r.mode) == e.mode and r.status != "skipped"
        ]
        if not ran:
            not_run.append((e, "its case did not run"))
            continue
        d = Defect(row.name, e.case, e.kind, e.mode, e.min_devices, e.op, e.severity)
        without = [r for r in ran if not any(_names(d, r, f) for f in r.findings)]
        if without:
            missed.append(
                (e, "not found on " + ", ".join(sorted({f"{r.case} {r.device}" for r in without})))
            )
        else:
            found.append(e)
    live = [e for e in row.expected if devices >= e.min_devices]
    unexpected = []
    for r in mine:
        here = [e for e in live if e.case == _base(r.case) and e.mode == pass_of(r.mode)]
        explained = any(
            _names(Defect(row.name, e.case, e.kind, e.mode, e.min_devices, e.op, "error"), r, f)
            for e in here
            if e.severity == "error"
            for f in r.findings
        )
        for f in r.findings:
            if f.severity not in ("warning", "error"):
                continue
            if any(_matches_expect(e, r, f) for e in here):
                continue
            if explained and f.kind in SYMPTOM_KINDS:
                continue
            unexpected.append(
                {
                    "device": r.device,
                    "case": r.case,
                    "mode": r.mode,
                    "kind": f.kind,
                    "op": f.op or f.kernel,
                    "message": f.message,
                }
            )
    ran_any = any(r.status != "skipped" for r in mine)
    return ZooResult(row, found, missed, not_run, unexpected, ran_any)


def zoo_matrix(records: Iterable[CaseRecord], devices: int) -> list[ZooResult]:
    """Every zoo row judged on the case records of a selftest run (diagnoses attached).

    An expectation is found when every record of its case that ran in its pass (not the
    wrong-device re-runs: evidence, not passes) carries a finding of its kind, at least its
    severity, on that device, whose op or kernel contains its ``op``; it is not run with
    fewer GPUs than it needs. A finding of severity warning or error on a record of the
    row's cases is unexpected unless an expectation of that case (that can run here) has its
    kind and, where the finding names an op or kernel, its op; a symptom
    (``SYMPTOM_KINDS``: crash, cuda-error, test-failure, ...) is explained by an expected
    diagnosis of severity error found on the same record."""
    recs = list(records)
    passes = {m for r in recs if (m := pass_of(r.mode)) is not None}
    return [_judge_zoo(row, recs, devices, passes) for row in ZOO]


#: the name of the real kernels among :func:`prebuild`'s builds (their clean twins use them)
KERNELS = "kernels"


def prebuild(
    logs: Path,
    names: Iterable[str] | None = None,
    pybind: Iterable[str] | None = None,
    zoo: Iterable[str] | None = None,
) -> list[str] | None:
    """JIT-build the defect builds (``gpucheck._csrc.defects.DEFECTS``), the builds of the pybind
    extension (``pybind``: ``clean`` and names of ``gpucheck._csrc.pybind.PYBIND_DEFECTS``, default
    all; logged as ``pybind_<build>``), the zoo's builds (``zoo``: names of
    ``gpucheck._csrc.zoo.ZOO_BUILDS``, default all; logged as ``zoo_<build>``) and, where they
    were not built at install, gpucheck's
    kernels (the clean twins' ops), all at once, one process each, from the package's
    sources into gpucheck's build cache
    (``gpucheck._csrc.toolchain.build_dir``): the selftest's workers then load them instead of
    building them one after another inside their cases (a cached build only loads). Each build's
    output goes to ``logs/<name>.log`` (the kernels': ``logs/kernels.log``). Returns the names
    whose build failed (their cases error with the compiler's message), or None when this
    machine cannot build them (no CUDA build of torch, or no nvcc): the cases then skip or
    fail on their own.
    """
    import importlib.util
    import os
    import subprocess
    import sys

    from gpucheck._csrc import toolchain
    from gpucheck._csrc.defects import DEFECTS
    from gpucheck._csrc.pybind import PYBIND_CLEAN, PYBIND_DEFECTS
    from gpucheck._csrc.zoo import ZOO_BUILDS

    names = list(DEFECTS if names is None else names)
    if not names or importlib.util.find_spec("torch") is None or toolchain.cuda_home() is None:
        return None
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.version.cuda)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode != 0 or probe.stdout.strip() in ("", "None"):
        return None
    logs.mkdir(parents=True, exist_ok=True)
    builds = {
        name: [
            "from gpucheck._csrc.defects import build_defect; "
            "build_defect(sys.argv[1], verbose=True)",
            name,
        ]
        for name in names
    }
    builds[KERNELS] = ["from gpucheck.ops import _ext; sys.exit(_ext.child_main())"]
    every = (PYBIND_CLEAN, *PYBIND_DEFECTS)
    for build in every if pybind is None else pybind:
        builds[f"pybind_{build}"] = [
            "from gpucheck._csrc.pybind import build_pybind; "
            "build_pybind(sys.argv[1], verbose=True)",
            build,
        ]
    for build in ZOO_BUILDS if zoo is None else zoo:
        builds[f"zoo_{build}"] = [
            "from gpucheck._csrc.zoo import build_zoo; build_zoo(sys.argv[1], verbose=True)",
            build,
        ]
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", str(max(1, (os.cpu_count() or 1) // len(builds))))
    procs = {}
    for name, (code, *args) in builds.items():
        with open(logs / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, "-c", f"import sys; {code}", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
    return [name for name, proc in procs.items() if proc.wait() != 0]


def read_run(run_dir: Path) -> tuple[list[CaseRecord], int]:
    """Every case record of the run in ``run_dir`` (its diagnoses attached) and how many
    GPUs it targeted."""
    log = RunLog.read(RunFolder(run_dir).results)
    devices = log.header.devices if log.header is not None else []
    return log.diagnosed_cases(), sum(d.device.startswith("cuda") for d in devices)


def verdict(
    rows: list[Row], false: list[dict[str, Any]], zoo: list[ZooResult] | None = None
) -> int:
    """0 every defect found and no false positive; 1 a defect missed or a false positive, or
    in the zoo (``zoo``) an expected finding missed or an unexpected one; 2 complete
    otherwise but some rows, zoo rows or zoo expectations could not run here (e.g. one
    GPU)."""
    zoo = zoo or []
    if (
        false
        or any(r.status == "missed" for r in rows)
        or any(z.missed or z.unexpected for z in zoo)
    ):
        return 1
    return (
        2
        if any(r.status == "not run" for r in rows) or any(z.not_run or not z.ran for z in zoo)
        else 0
    )
