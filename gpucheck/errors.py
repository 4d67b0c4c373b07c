"""Typed exceptions for errors a user can cause; the CLI turns them into one line + exit code."""

from __future__ import annotations

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


class GpucheckError(Exception):
    """An error with a one-sentence message meant for the user, and the exit code to use."""

    exit_code: int = EXIT_USAGE


class EnvironmentProblem(GpucheckError):
    """The machine cannot do what was asked (no GPU, no driver, library mismatch, ...)."""


class UsageProblem(GpucheckError):
    """The request itself is wrong (device out of range, unknown suite, unwritable --out, ...)."""


class ExtensionNotBuilt(GpucheckError):
    """gpucheck's CUDA extension is not available in this installation."""


class CheckpointError(GpucheckError):
    """A 3DGS checkpoint (.ply/.pt) cannot be read or written: the message names the problem."""


class BudgetExceeded(GpucheckError):
    """An operation would need more memory than the caller allowed (its ``max_bytes``)."""
