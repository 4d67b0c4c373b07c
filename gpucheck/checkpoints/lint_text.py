"""The words ``gpucheck lint-checkpoint`` prints for a :class:`LintReport`."""

from __future__ import annotations

from typing import Any

from gpucheck.checkpoints.lint import LintReport

__all__ = ["render_text"]

_LOADS = {
    "3dgs_load": "loaded with 3DGS conventions (exp of the stored scales)",
    "as_stored": "loaded as stored (scales taken as already activated)",
}


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def _load_line(name: str, est: dict[str, Any], correct: bool) -> str:
    r = est["radius_percentiles_px"]
    return (
        f"    {_LOADS[name]}{' [correct load]' if correct else ''}: {est['overlaps']:,} "
        f"Gaussian-tile overlaps -> binning needs {_bytes(est['bytes'])}; "
        f"{est['visible']:,} visible, radius p50 {r['p50']} / p99 {r['p99']} px, "
        f"{est['share_huge']:.1%} cover > 25 % of the image"
    )


def render_text(r: LintReport) -> str:
    """Several lines: the verdict, one line per parameter, the fix, the render estimate."""
    if r.verdict == "unreadable":
        return f"{r.path}: UNREADABLE: {r.error}"
    lines = [
        f"{r.path}: {r.verdict.upper()} ({r.n:,} Gaussians, SH degree {r.sh_degree}, {r.layout})"
    ]
    lines += [f"  {p.name:<10} {p.verdict:<10} {p.says}" for p in r.params]
    if r.fix:
        lines.append(f"  fix: {r.fix}")
    if r.render:
        lines.append(f"  render {r.render['width']}x{r.render['height']} ({r.render['method']}):")
        for name in ("3dgs_load", "as_stored"):
            if name in r.render:
                lines.append(_load_line(name, r.render[name], r.render["correct_load"] == name))
    return "\n".join(lines)
