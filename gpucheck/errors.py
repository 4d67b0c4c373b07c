"""Typed exceptions for errors a user can cause; the CLI turns them into one line + exit code."""

from __future__ import annotations

import re

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2

#: text that marks a CUDA error (torch's messages, cuBLAS statuses, device-side asserts)
CUDA_ERROR_MARKERS = (
    "CUDA error",
    "illegal memory access",
    "CUBLAS_STATUS",
    "cudaError",
    "device-side assert",
)
#: CUDA errors after which the process's CUDA context is unusable: every later call fails too
#: ("device-side assert triggered", not "device-side assert": torch ends every CUDA error's
#: message with "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "unspecified launch failure",
    "illegal instruction",
    "misaligned address",
    "device-side assert triggered",
    "hardware stack error",
    "uncorrectable ECC",
    "launch timed out",
    "an illegal address",
)


def sticky_cuda_error_line(text: str) -> str | None:
    """The first line of ``text`` (an error's message, a test's failure report) that names a
    CUDA error after which the process's context is unusable, or None."""
    if not any(m in text for m in CUDA_ERROR_MARKERS):
        return None
    return next(
        (line.strip() for line in text.splitlines() if any(m in line for m in STICKY_CUDA_ERRORS)),
        None,
    )


class GpucheckError(Exception):
    """An error with a one-sentence message meant for the user, and the exit code to use."""

    exit_code: int = EXIT_USAGE


class EnvironmentProblem(GpucheckError):
    """The machine cannot do what was asked (no GPU, no driver, library mismatch, ...)."""


class UsageProblem(GpucheckError):
    """The request itself is wrong (device out of range, unknown suite, unwritable --out, ...)."""


class OutputProblem(EnvironmentProblem):
    """A record cannot be written to the run folder (the disk is full, the folder became
    read-only): the run stops; every record written before is kept."""


class ExtensionNotBuilt(GpucheckError):
    """gpucheck's CUDA extension is not available in this installation."""


class CheckpointError(GpucheckError):
    """A 3DGS checkpoint (.ply/.pt) cannot be read or written: the message names the problem."""


class BudgetExceeded(GpucheckError):
    """An operation would need more memory than the caller allowed (its ``max_bytes``)."""


class MemoryAnomalyError(BudgetExceeded):
    """The splat rasterizer's memory preflight failed: binning the Gaussian-tile overlaps
    would exceed ``max_bytes`` or the free device memory (story 3: scales activated twice make
    every Gaussian cover every tile). Raised before any binning buffer is allocated.

    Attributes (None where the message did not carry them):
        n: number of Gaussians.
        visible: Gaussians with a non-zero radius.
        overlaps: Gaussian-tile overlaps in total.
        bytes_needed: bytes the binning would need (with the sort's scratch when compared
            with the free memory).
        bytes_free: bytes free on the device (driver plus the caching allocator's reserve).
        radius_percentiles: ``{"p50", "p90", "p99", "max"}`` of the visible radii, pixels.
        large_share: share of the Gaussians covering more than 25 % of the image's tiles.
        hint: the likely cause, e.g. "scales look already exponentiated: activation applied
            twice? ...".
    """

    _FIELDS = re.compile(
        r"(?P<n>\d+) Gaussians \((?P<visible>\d+) visible\) touch (?P<overlaps>\d+) tiles in "
        r"total .*?binning needs (?P<needed>\d+) bytes, (?P<free>\d+) bytes free; radius "
        r"percentiles \(visible, px\) p50 (?P<p50>\d+), p90 (?P<p90>\d+), p99 (?P<p99>\d+), "
        r"max (?P<max>\d+); \d+ Gaussians \((?P<share>[0-9.e+-]+) %\) cover more than 25 % of "
        r"the image\. Hint: (?P<hint>.*)$",
        re.DOTALL,
    )

    def __init__(self, message: str) -> None:
        super().__init__(message)
        found = self._FIELDS.search(message)
        self.n: int | None = None
        self.visible: int | None = None
        self.overlaps: int | None = None
        self.bytes_needed: int | None = None
        self.bytes_free: int | None = None
        self.radius_percentiles: dict[str, int] | None = None
        self.large_share: float | None = None
        self.hint: str | None = None
        if found:
            self.n, self.visible, self.overlaps = (
                int(found[k]) for k in ("n", "visible", "overlaps")
            )
            self.bytes_needed, self.bytes_free = int(found["needed"]), int(found["free"])
            self.radius_percentiles = {k: int(found[k]) for k in ("p50", "p90", "p99", "max")}
            self.large_share = float(found["share"]) / 100.0
            self.hint = found["hint"].strip()
