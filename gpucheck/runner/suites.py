"""Finding suites: ``--suite NAME`` (a folder of suites/) or ``--suite PATH``."""

from __future__ import annotations

from pathlib import Path

from gpucheck.errors import UsageProblem

#: suites/ of the gpucheck checkout (editable installs); the current directory's comes first.
PROJECT_SUITES = Path(__file__).resolve().parents[2] / "suites"


def suite_roots() -> list[Path]:
    roots = [Path.cwd() / "suites", PROJECT_SUITES]
    seen: list[Path] = []
    for r in roots:
        if r.is_dir() and r.resolve() not in seen:
            seen.append(r.resolve())
    return seen


def _suites_in(root: Path) -> dict[str, Path]:
    return {d.name: d for d in sorted(root.iterdir())
            if d.is_dir() and not d.name.startswith((".", "_")) and any(d.rglob("test_*.py"))}


def available() -> dict[str, Path]:
    """Every suite folder (one holding test_*.py) under the suite roots, by name."""
    found: dict[str, Path] = {}
    for root in suite_roots():
        for name, path in _suites_in(root).items():
            found.setdefault(name, path)
    return found


#: suites that only run when named: they exist to produce findings (the harness's self-test)
NAMED_ONLY = ("selftest",)
#: our suites that test gpucheck's own kernels (gpucheck.ops): without the compiled extension
#: they cannot run at all, which the run says once instead of failing every case
NEEDS_KERNELS = ("ssim", "knn", "splat")


def needs_kernels(path: Path) -> bool:
    """True for one of gpucheck's own kernel suites, or a file of one (by its place in our
    suites/ folder)."""
    p = path.resolve()
    roots = [(PROJECT_SUITES / n).resolve() for n in NEEDS_KERNELS]
    return any(p == r or r in p.parents for r in roots)


def default() -> dict[str, Path]:
    """The suites of the first root that has any: ./suites/ in a user's project, else ours."""
    for root in suite_roots():
        if found := {n: p for n, p in _suites_in(root).items() if n not in NAMED_ONLY}:
            return found
    return {}


def resolve(requested: tuple[str, ...] | list[str]) -> dict[str, Path]:
    """Map each requested suite to its path; the default suites when none is requested."""
    if not requested:
        found = default()
        if not found:
            raise UsageProblem("no suites found: pass --suite PATH or run from a directory "
                               "that has a suites/ folder")
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
        else:
            names = ", ".join(sorted(known)) or "none"
            raise UsageProblem(f"unknown suite {item!r}: not a path, and not one of the known "
                               f"suites ({names})")
    return chosen
