"""Shared helpers for gpucheck's CPU tests."""

from __future__ import annotations

pytest_plugins = ["pytester"]
