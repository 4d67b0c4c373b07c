"""Finding suites: ``--suite NAME`` (a folder of suites/), ``--suite PATH`` (a folder or one
test file) or ``--suite package.module`` (an importable module or package, e.g. the tests an
installed extension ships).

A suite folder says what it needs next to its tests, in ``suite.toml`` (:class:`Declared`)::

    needs = "kernels"                               # "gpu" (default), "kernels", "cpu-only"
    probe = "gpucheck._csrc.extension:problem_in_child"  # why it cannot run now, or None
    named-only = true                               # only run when named (default false)
    distributed = true                              # a default of ``run --distributed``

The controller knows no suite by name: it reads their declarations.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpucheck import _resources
from gpucheck.errors import UsageProblem

#: the file next to a suite's tests that declares what the suite needs
DECLARATION = "suite.toml"
NEEDS = ("gpu", "kernels", "cpu-only")


@dataclass(frozen=True)
class Declared:
    """What a suite folder's ``suite.toml`` declares (a folder without one: the defaults)."""

    #: ``gpu``: its cases run on each device; ``kernels``: they also need gpucheck's compiled
    #: kernels, without which the suite cannot run at all (the run says so once instead of
    #: failing every case); ``cpu-only``: it holds no GPU case (the default of ``--cpu-only``,
    #: never of a GPU run)
    needs: str = "gpu"
    #: ``module:function`` returning why the suite cannot run here, or None when it can
    probe: str | None = None
    #: run only when named (suites that exist to produce findings: the self-tests)
    named_only: bool = False
    #: one of the suites of ``gpucheck run --distributed`` when none is named
    distributed: bool = False


def declared(path: Path) -> Declared:
    """The declaration of the suite ``path`` is (or lies in): the nearest ``suite.toml`` in
    its folder or above, below its suite root; the defaults where there is none."""
    p = path.resolve()
    roots = set(suite_roots())
    for folder in [p, *p.parents] if p.is_dir() else list(p.parents):
        if folder in roots:
            break
        if (folder / DECLARATION).is_file():
            return read_declaration(folder / DECLARATION)
    return Declared()


def read_declaration(path: Path) -> Declared:
    """One ``suite.toml``; a broken one is a usage problem naming the file."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise UsageProblem(f"cannot read {path}: {err}") from None
    known = {"needs", "probe", "named-only", "distributed"}
    unknown = sorted(set(table) - known)
    needs = table.get("needs", "gpu")
    probe = table.get("probe")
    if unknown or needs not in NEEDS or not (probe is None or _probe_name(probe)):
        raise UsageProblem(
            f'{path}: expected needs = one of {", ".join(NEEDS)}, probe = "module:function", '
            f"named-only and distributed = true or false; got {table}"
        )
    return Declared(
        needs=needs,
        probe=probe,
        named_only=bool(table.get("named-only", False)),
        distributed=bool(table.get("distributed", False)),
    )


def _probe_name(probe: object) -> bool:
    return isinstance(probe, str) and bool(re.fullmatch(r"[\w.]+:\w+", probe))


def probe_problem(probe: str) -> str | None:
    """Run a suite's probe (``module:function``, imported only now: the controller knows no
    suite's needs in advance): why the suite cannot run here, or None when it can."""
    module, _, function = probe.partition(":")
    check: Callable[[], str | None] = getattr(importlib.import_module(module), function)
    return check()


#: gpucheck's own suites, as installed with it (gpucheck.suites: wheel, sdist or editable
#: install alike); a suites/ folder in the current directory comes first.
PROJECT_SUITES = _resources.suites()


def suite_roots() -> list[Path]:
    """Where suites are looked for by name: ./suites/, then gpucheck's own. In a checkout
    of gpucheck (a wheel built from it installed), its ./suites/ is gpucheck's own suites:
    the installed copy of them is used, the one root of gpucheck's own."""
    here = Path.cwd()
    checkout = (here / "gpucheck" / "_resources.py").is_file()
    roots = [] if checkout else [here / "suites"]
    seen: list[Path] = []
    for r in [*roots, PROJECT_SUITES]:
        if r.is_dir() and r.resolve() not in seen:
            seen.append(r.resolve())
    return seen


def _suites_in(root: Path) -> dict[str, Path]:
    """The suites of a folder of suites, by name: each folder in it that holds test_*.py
    files, and each test_*.py file directly in it (a suite of one file, named by its stem)."""
    found: dict[str, Path] = {}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_dir() and any(entry.rglob("test_*.py")):
            found[entry.name] = entry
        elif entry.is_file() and fnmatch.fnmatch(entry.name, "test_*.py"):
            found.setdefault(entry.stem, entry)
    return found


def available() -> dict[str, Path]:
    """Every suite folder (one holding test_*.py) under the suite roots, by name."""
    found: dict[str, Path] = {}
    for root in suite_roots():
        for name, path in _suites_in(root).items():
            found.setdefault(name, path)
    return found


def distributed() -> tuple[str, ...]:
    """The suites of ``gpucheck run --distributed`` when none is named (those declared
    ``distributed``)."""
    names = [
        n for root in suite_roots() for n, p in _suites_in(root).items() if declared(p).distributed
    ]
    return tuple(dict.fromkeys(names))  # a name resolves as before: ./suites/ first


def needs_kernels(path: Path) -> bool:
    """True for a suite (or a file of one) that declares it needs gpucheck's kernels."""
    return declared(path).needs == "kernels"


def default(cpu_only: bool = False) -> dict[str, Path]:
    """The suites of the first root that has any: ./suites/ in a user's project, else ours:
    the GPU suites, or with ``cpu_only`` those of ours that need no GPU (declared
    ``cpu-only``). Suites declared ``named-only`` are never a default."""
    for root in suite_roots():
        found = {n: p for n, p in _suites_in(root).items() if not declared(p).named_only}
        if found and root == PROJECT_SUITES.resolve():
            found = {n: p for n, p in found.items() if cpu_only_suite(p) == cpu_only}
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
    if not defaults_are_ours():
        return []
    return sorted(n for n, p in default().items() if not cpu_only_suite(p))


def left_out_note() -> str | None:
    """The note of a default ``--cpu-only`` run on the suites it leaves out (None: none)."""
    gpu_only = left_out_without_gpu()
    if not gpu_only:
        return None
    return (
        f"--cpu-only: the suites {', '.join(gpu_only)} test CUDA kernels and need a GPU; "
        "they were not run (`gpucheck run` on a machine with one)"
    )


def cpu_only_suite(path: Path) -> bool:
    """Whether the suite ``path`` declares it holds no GPU case."""
    return declared(path).needs == "cpu-only"


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
        # a folder of that name here that holds no test file (`python -m build`'s dist/)
        # does not hide the suite of that name
        if path.exists() and (item not in known or path.is_file() or _holds_tests(path)):
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


def _holds_tests(folder: Path) -> bool:
    return any(folder.rglob("test_*.py")) or any(folder.rglob("*_test.py"))


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
