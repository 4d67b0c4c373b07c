"""Finding suites: ``--suite NAME`` (a folder of suites/), ``--suite PATH`` (a folder or one
test file) or ``--suite package.module`` (an importable module or package, e.g. the tests an
installed extension ships)."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from gpucheck import _resources
from gpucheck.errors import UsageProblem

#: gpucheck's own suites, as installed with it (gpucheck.suites: wheel, sdist or editable
#: install alike); a suites/ folder in the current directory comes first.
PROJECT_SUITES = _resources.suites()


def suite_roots() -> list[Path]:
    """Where suites are looked for by name: ./suites/, then gpucheck's own."""
    roots = [Path.cwd() / "suites", PROJECT_SUITES]
    seen: list[Path] = []
    for r in roots:
        if r.is_dir() and r.resolve() not in seen:
            seen.append(r.resolve())
    return seen


def _suites_in(root: Path) -> dict[str, Path]:
    return {
        d.name: d
        for d in sorted(root.iterdir())
        if d.is_dir() and not d.name.startswith((".", "_")) and any(d.rglob("test_*.py"))
    }


def available() -> dict[str, Path]:
    """Every suite folder (one holding test_*.py) under the suite roots, by name."""
    found: dict[str, Path] = {}
    for root in suite_roots():
        for name, path in _suites_in(root).items():
            found.setdefault(name, path)
    return found


#: suites that only run when named: they exist to produce findings (the harness's self-test)
NAMED_ONLY = ("selftest", "dist", "dist_selftest")
#: the suites of ``gpucheck run --distributed`` when none is named
DISTRIBUTED = ("dist",)
#: our suites that test gpucheck's own kernels (gpucheck.ops): without the compiled extension
#: they cannot run at all, which the run says once instead of failing every case
NEEDS_KERNELS = ("ssim", "knn", "splat")
#: our suites that need no GPU (the oracles, checkpoint I/O): the default of ``--cpu-only``,
#: never of a GPU run (they hold no GPU case to run on each device)
CPU_ONLY = ("reference", "checkpoints")


def needs_kernels(path: Path) -> bool:
    """True for one of gpucheck's own kernel suites, or a file of one (by its place in our
    suites/ folder)."""
    p = path.resolve()
    roots = [(PROJECT_SUITES / n).resolve() for n in NEEDS_KERNELS]
    return any(p == r or r in p.parents for r in roots)


def default(cpu_only: bool = False) -> dict[str, Path]:
    """The suites of the first root that has any: ./suites/ in a user's project, else ours:
    the GPU suites, or with ``cpu_only`` those of ours that need no GPU (:data:`CPU_ONLY`)."""
    for root in suite_roots():
        found = {n: p for n, p in _suites_in(root).items() if n not in NAMED_ONLY}
        if found and root == PROJECT_SUITES.resolve():
            found = {n: p for n, p in found.items() if (n in CPU_ONLY) == cpu_only}
        if found:
            return found
    return {}


def defaults_are_ours() -> bool:
    """Whether the default suites are gpucheck's own (no ./suites/ of the user's here)."""
    roots = suite_roots()
    return bool(roots) and roots[0] == PROJECT_SUITES.resolve()


def left_out_without_gpu() -> list[str]:
    """Our default suites that ``--cpu-only`` leaves out because every case needs a GPU
    (empty when ./suites/ holds the user's own, which run with their GPU cases skipped)."""
    return sorted(set(default()) - set(CPU_ONLY)) if defaults_are_ours() else []


def resolve(requested: tuple[str, ...] | list[str], cpu_only: bool = False) -> dict[str, Path]:
    """Map each requested suite to its path; the default suites (:func:`default`) when none
    is requested."""
    if not requested:
        found = default(cpu_only)
        if not found:
            raise UsageProblem(
                "no suites found: pass --suite PATH or run from a directory "
                "that has a suites/ folder"
            )
        return found
    known = available()
    chosen: dict[str, Path] = {}
    for item in requested:
        path = Path(item)
        if path.exists():
            name = path.stem if path.is_file() else path.resolve().name
            chosen[name] = path.resolve()
        elif item in known:
            chosen[item] = known[item]
        elif (module := module_path(item)) is not None:
            chosen[item] = module
        elif os.sep in item or "/" in item or item.endswith(".py"):  # meant as a path
            missing = next(
                (
                    p
                    for p in [*reversed(path.absolute().parents), path.absolute()]
                    if not p.exists()
                ),
                path.absolute(),
            )
            raise UsageProblem(f"suite {item!r} does not exist: there is no {missing}")
        else:
            names = ", ".join(sorted(known)) or "none"
            raise UsageProblem(
                f"unknown suite {item!r}: no file or folder of that name here, "
                f"not one of the known suites ({names}), and not an "
                "importable module"
            )
    return chosen


_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def module_path(name: str) -> Path | None:
    """The file of module ``name`` (``pkg.tests.test_x``) or the folder of package ``name``,
    found without importing it (its parent packages are imported); None if there is none."""
    if not _DOTTED.fullmatch(name):
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    if spec.origin and spec.origin.endswith(".py"):
        return Path(spec.origin).resolve()
    return None
