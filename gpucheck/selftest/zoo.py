"""The self-test's zoo (``suites/selftest/zoo/``): pybind11 extensions in the shape of the
field's code, each row a build and its cases, stating every finding they must draw; any other
finding is unexpected (:func:`zoo_matrix`: recall and unexpected findings per row)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpucheck.detectors.registry import kinds
from gpucheck.model.kinds import SYMPTOM
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.selftest.matrix import Defect, base_case, names_defect, pass_of

RACECHECK = "sanitizer:racecheck"


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
    """A row of one case: ``expected`` as (kind, op, min_devices[, severity[, mode]])."""
    return ZooRow(
        name,
        bugs,
        (case,),
        tuple(
            Expect(
                kind,
                case,
                op,
                n,
                mode=rest[1] if len(rest) > 1 else "plain",
                severity=rest[0] if rest else "error",
            )
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
        "rasterizer with tile masks, fixed twin (a mask-aware step, loss in CHW and in HWC)",
        "",
        (_ZR + "test_raster_clean_mask_train",),
    ),
    _zoo_row(
        "rasterizer with tile masks: the masked tiles' alphas and last indices never written",
        "outputs left unwritten (at::empty) where a mask skips the tile",
        _ZR + "test_raster_mask_unwritten_train",
        ("unwritten-output", _M + "raster_mask_unwritten.rasterize_gaussians", 1),
    ),
    _zoo_row(
        "rasterizer with tile masks, loss in HWC: alphas never written, the image's gradient "
        "read as if contiguous",
        "outputs left unwritten + a permuted gradient read as contiguous (2 ops)",
        _ZR + "test_raster_unwritten_assume_contiguous_train",
        ("unwritten-output", _M + "raster_unwritten_assume_contiguous.rasterize_gaussians", 1),
        (
            "memory-layout",
            _M + "raster_unwritten_assume_contiguous.rasterize_gaussians_backward",
            1,
        ),
    ),
    ZooRow(
        "projection: culled Gaussians' entries left unwritten, radius 0 (the convention)",
        "",
        (_ZR + "test_project_clean_determinism",),
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
    ZooRow(
        "SSIM loss on a permuted image, clean twin (copies it contiguous)",
        "",
        (_ZS + "test_ssim_clean_permuted_grad",),
    ),
    _zoo_row(
        "SSIM loss: the backward reads the saved permuted image as if contiguous",
        "a permuted input read as contiguous in backward",
        _ZS + "test_ssim_assume_contiguous_permuted_grad",
        ("memory-layout", _M + "ssim_assume_contiguous.fusedssim_backward", 1),
    ),
    ZooRow(
        "SSIM loss under racecheck, clean twin (its tile read after the barrier)",
        "",
        (_ZS + "test_ssim_clean_sanitized_train",),
    ),
    _zoo_row(
        "SSIM loss: the backward's shared-memory tile read before its barrier (racecheck)",
        "a shared-memory race in backward",
        _ZS + "test_ssim_nosync_train",
        ("data-race", _M + "ssim_nosync.fusedssim_backward", 1, "error", RACECHECK),
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
    mine = [r for r in recs if base_case(r.case) in row.cases and pass_of(r.mode) is not None]
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
            if base_case(r.case) == e.case and pass_of(r.mode) == e.mode and r.status != "skipped"
        ]
        if not ran:
            not_run.append((e, "its case did not run"))
            continue
        d = Defect(row.name, e.case, e.kind, e.mode, e.min_devices, e.op, e.severity)
        without = [r for r in ran if not any(names_defect(d, r, f) for f in r.findings)]
        if without:
            missed.append(
                (e, "not found on " + ", ".join(sorted({f"{r.case} {r.device}" for r in without})))
            )
        else:
            found.append(e)
    live = [e for e in row.expected if devices >= e.min_devices]
    unexpected = []
    for r in mine:
        here = [e for e in live if e.case == base_case(r.case) and e.mode == pass_of(r.mode)]
        explained = any(
            names_defect(
                Defect(row.name, e.case, e.kind, e.mode, e.min_devices, e.op, "error"), r, f
            )
            for e in here
            if e.severity == "error"
            for f in r.findings
        )
        for f in r.findings:
            if f.severity not in ("warning", "error"):
                continue
            if any(_matches_expect(e, r, f) for e in here):
                continue
            if explained and kinds().of(f.kind).role == SYMPTOM:
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
    kind and, where the finding names an op or kernel, its op; a symptom (a kind its maker
    declares one: crash, cuda-error, test-failure, ...) is explained by an expected
    diagnosis of severity error found on the same record."""
    recs = list(records)
    passes = {m for r in recs if (m := pass_of(r.mode)) is not None}
    return [_judge_zoo(row, recs, devices, passes) for row in ZOO]
