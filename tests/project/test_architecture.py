"""The layering of ``gpucheck/``, measured with ``ast``: no import cycle (type-only imports
count), no import from a lower floor to a higher one (a function-level, lazy one only with a
``lazy:`` comment saying why), the kernel wing fenced off from the harness, the model and the
reports, no private name used outside its module, no module or function over its line limit
(but those still listed, each with the area that owns it), no record's payload read as a dict
past its reader in ``model/``.

The floors are :data:`FLOORS`, the one table of them. The measuring functions are tested on a
synthetic package too, so that these tests can fail.
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "gpucheck"
PACKAGE_DIR = Path(__file__).resolve().parents[2] / PACKAGE
#: the most lines a module may have, as `ruff format` lays them out, not counting its data
#: tables (module-level assignments of a literal dict, list, tuple or set)
MAX_LINES = 600
#: the most lines a function's body may have, its docstring not counted
MAX_FUNCTION_LINES = 80
#: what is still over those limits, each with the area that owns it: the list only shrinks (an
#: entry no longer over must go). A module by its path, a function as ``path::qualified.name``.
OVER_THE_LIMITS: dict[str, str] = {}
LAZY_MARK = "lazy:"

#: floor of each part of gpucheck, low to high: a module may import from its own floor and
#: the ones below. A module's floor is that of its longest listed dotted prefix; the package
#: itself (``gpucheck``, its ``__init__``) matches only exactly.
FLOORS: dict[str, int] = {
    # 0 base
    "gpucheck": 0,
    "gpucheck.errors": 0,
    "gpucheck._resources": 0,
    "gpucheck._distribution": 0,
    # 1 data model: records, findings, modes, the run folder's layout, the worker contract
    "gpucheck.model": 1,
    # 2 tools
    "gpucheck.nvml": 2,
    "gpucheck.nvml_sampler": 2,
    "gpucheck.devices": 2,
    "gpucheck._cuda_probe": 2,
    "gpucheck.sanitizer": 2,
    "gpucheck.testing": 2,
    "gpucheck.processes": 2,
    # 3 detectors
    "gpucheck.detectors": 3,
    "gpucheck.distributed": 3,
    # 4 the kernel wing: the bundled kernels, their oracles, checkpoint I/O (and its
    # detectors, registered through the entry point group): the toolkit's test subjects
    "gpucheck._csrc": 4,
    "gpucheck.kernels": 4,
    "gpucheck.ops": 4,
    "gpucheck.reference": 4,
    "gpucheck.checkpoints": 4,
    # 5 worker side and outputs
    "gpucheck.worker": 5,
    "gpucheck.check": 5,
    "gpucheck.report": 5,
    # 6 controller
    "gpucheck.controller": 6,
    # 7 entry points
    "gpucheck.pytest_plugin": 7,
    "gpucheck.cli": 7,
    "gpucheck.__main__": 7,
    "gpucheck.selftest": 7,
}
#: the kernel wing (floor 4), and the parts of the toolkit that never import it, not even in
#: a function: the harness, the data model and the reports run without the bundled kernels
WING = (
    "gpucheck._csrc",
    "gpucheck.kernels",
    "gpucheck.ops",
    "gpucheck.reference",
    "gpucheck.checkpoints",
)
FENCED = ("gpucheck.model", "gpucheck.worker", "gpucheck.controller", "gpucheck.report")


@dataclass(frozen=True)
class Import:
    """One import of a module of the package by another (or the same) one."""

    source: str  # the importing module
    line: int
    target: str  # the imported module
    lazy: bool  # inside a function
    commented: bool  # a `lazy:` comment on its line(s) or the line just above
    type_only: bool = False  # under ``if TYPE_CHECKING:``: still an edge of the graph

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}"


# --- measuring ---------------------------------------------------------------------------


def module_files(package_dir: Path, package: str) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = path
    return out


def _comment_lines(source: str) -> set[int]:
    """Lines with a comment containing :data:`LAZY_MARK`."""
    lines: set[int] = set()
    if LAZY_MARK not in source:
        return lines
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and LAZY_MARK in tok.string:
            lines.add(tok.start[0])
    return lines


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(
    tree: ast.AST,
) -> Iterable[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """The imports of a module with whether each is inside a function and whether it is
    type-only (in an ``if TYPE_CHECKING:`` body; its ``else`` is not)."""

    def walk(
        node: ast.AST, lazy: bool, typing: bool
    ) -> Iterable[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                continue  # an expression: no import statement inside
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, lazy, typing
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.body:
                    yield from walk(ast.Module(body=[sub], type_ignores=[]), lazy, True)
                for sub in child.orelse:
                    yield from walk(ast.Module(body=[sub], type_ignores=[]), lazy, typing)
            else:
                inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                yield from walk(child, inner, typing)

    yield from walk(tree, False, False)


def _existing(name: str, modules: Mapping[str, Path]) -> str:
    """``name``, or its longest prefix that is a module of the package."""
    parts = name.split(".")
    while len(parts) > 1 and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts)


def imports_of(module: str, path: Path, modules: Mapping[str, Path], package: str) -> list[Import]:
    """The imports of ``module`` (the file ``path``) of modules of ``package``.

    ``from P import X`` imports the module ``P.X`` where there is one, else ``P`` (X is a
    name defined in P). Relative imports are resolved; parent packages that Python runs on
    the way are not counted as imported.
    """
    source = path.read_text()
    marks = _comment_lines(source)
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: dict[tuple[int, str], Import] = {}
    for node, lazy, type_only in _import_nodes(ast.parse(source, filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            if node.level:
                base_parts = here.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if alias.name != "*" and sub in modules else base)
        end = node.end_lineno or node.lineno
        commented = any(n in marks for n in range(node.lineno - 1, end + 1))
        for target in targets:
            if target != package and not target.startswith(package + "."):
                continue
            found = _existing(target, modules)
            out.setdefault(
                (node.lineno, found),
                Import(module, node.lineno, found, lazy, commented, type_only),
            )
    return list(out.values())


def import_graph(package_dir: Path, package: str) -> tuple[dict[str, Path], list[Import]]:
    """The modules of the package and every import among them."""
    modules = module_files(package_dir, package)
    imports = [
        imp for name, path in modules.items() for imp in imports_of(name, path, modules, package)
    ]
    return modules, imports


def find_cycles(imports: Iterable[Import]) -> list[list[Import]]:
    """One import cycle per strongly connected set of modules, counting module-level imports,
    type-only ones (``if TYPE_CHECKING:``) too (an import of a module by itself aside), as the
    imports along it: a split that needs a type from the other side was cut in the wrong
    place."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if not imp.lazy and imp.source != imp.target:
            edges.setdefault(imp.source, {}).setdefault(imp.target, imp)
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            components.append(comp)

    for v in sorted(edges):
        if v not in index:
            connect(v)
    cycles = []
    for comp in components:
        if len(comp) < 2:
            continue
        start = min(comp)
        # shortest way from start back to start inside the component
        paths: dict[str, list[Import]] = {start: []}
        queue = [start]
        found: list[Import] | None = None
        while queue and found is None:
            v = queue.pop(0)
            for w, imp in sorted(edges.get(v, {}).items()):
                if w == start:
                    found = [*paths[v], imp]
                    break
                if w in comp and w not in paths:
                    paths[w] = [*paths[v], imp]
                    queue.append(w)
        assert found is not None
        cycles.append(found)
    return cycles


def floor_of(module: str, floors: Mapping[str, int], package: str) -> int | None:
    """The floor of the longest listed prefix of ``module`` (the package matches only
    itself); None where none is listed."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in floors and (prefix != package or n == len(parts)):
            return floors[prefix]
    return None


def unlisted(modules: Iterable[str], floors: Mapping[str, int], package: str) -> list[str]:
    return sorted(m for m in modules if floor_of(m, floors, package) is None)


def upward(
    imports: Iterable[Import], floors: Mapping[str, int], package: str
) -> tuple[list[Import], list[Import]]:
    """Imports from a lower floor to a higher one: (module-level ones, lazy or type-only ones
    without a ``lazy:`` comment: they never run at import, but still need a reason)."""
    eager, lazy = [], []
    for imp in imports:
        src, dst = floor_of(imp.source, floors, package), floor_of(imp.target, floors, package)
        if src is None or dst is None or dst <= src:
            continue
        if not imp.lazy and not imp.type_only:
            eager.append(imp)
        elif not imp.commented:
            lazy.append(imp)
    return eager, lazy


def _docstring(body: list[ast.stmt]) -> bool:
    first = body[0] if body else None
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )


def code_lines(tree: ast.Module, lines: int) -> int:
    """The lines of a module of ``lines`` lines that count against :data:`MAX_LINES`: all but
    those of its data tables (module-level assignments of a literal dict, list, tuple or
    set)."""
    tables = sum(
        node.end_lineno - node.lineno + 1
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and isinstance(node.value, (ast.Dict, ast.List, ast.Tuple, ast.Set))
        and node.end_lineno is not None
    )
    return lines - tables


def function_lines(tree: ast.Module) -> dict[str, int]:
    """Each function's (and method's) body lines, its docstring not counted, by qualified name
    (``Class.method``, ``outer.inner``)."""
    out: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = child.body[1:] if _docstring(child.body) else child.body
                if body and child.end_lineno is not None:
                    out[prefix + child.name] = child.end_lineno - body[0].lineno + 1
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def over_the_limits(
    files: Mapping[str, Path], modules: int = MAX_LINES, functions: int = MAX_FUNCTION_LINES
) -> dict[str, int]:
    """What is over the limits in ``files`` (a name -> its file): a module by its name, a
    function as ``name::qualified.name``, each with its count of lines."""
    out: dict[str, int] = {}
    for name, path in files.items():
        source = path.read_text()
        tree = ast.parse(source, filename=str(path))
        counted = code_lines(tree, len(source.splitlines()))
        if counted > modules:
            out[name] = counted
        for function, n in function_lines(tree).items():
            if n > functions:
                out[f"{name}::{function}"] = n
    return out


def _within(module: str, parts: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in parts)


def fence_crossings(
    imports: Iterable[Import], wing: Iterable[str], fenced: Iterable[str]
) -> list[Import]:
    """Imports (module-level, lazy or type-only alike) of a module of ``wing`` by a module of
    ``fenced``."""
    wing, fenced = tuple(wing), tuple(fenced)
    return [i for i in imports if _within(i.source, fenced) and _within(i.target, wing)]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level (definitions, assignments, imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@dataclass(frozen=True)
class PrivateUse:
    """A private name (one leading underscore) of one module used by another."""

    source: str
    line: int
    target: str
    name: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line} uses {self.target}.{self.name}"


def private_uses(modules: Mapping[str, Path], package: str) -> list[PrivateUse]:
    """Private names a module of the package defines and another module uses: imported
    (``from m import _x``) or reached through the module (``m._x``). A private module of the
    package (``_resources``, a compiled ``_C``) is not a private name: only what a module
    binds itself is."""
    trees = {m: ast.parse(p.read_text(), filename=str(p)) for m, p in modules.items()}
    defined = {m: _defined(t) for m, t in trees.items()}
    out: list[PrivateUse] = []
    for module, tree in trees.items():
        here = module if modules[module].name == "__init__.py" else module.rpartition(".")[0]
        bound: dict[str, str] = {}  # local name -> module of the package it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = here.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                else:
                    base = node.module or ""
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:
                        bound[alias.asname or alias.name] = sub
                    elif (
                        base in modules
                        and base != module
                        and _private(alias.name)
                        and alias.name in defined[base]
                    ):
                        out.append(PrivateUse(module, node.lineno, base, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        local = alias.asname or alias.name
                        bound[local] = alias.name if alias.asname else local
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            chain: list[str] = []
            value: ast.expr = node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if not (isinstance(value, ast.Name) and value.id in bound):
                continue
            target = ".".join([bound[value.id], *reversed(chain)])
            if target in modules and target != module and node.attr in defined[target]:
                out.append(PrivateUse(module, node.lineno, target, node.attr))
    return sorted(set(out), key=lambda u: (u.source, u.line, u.name))


def _describe(imps: Iterable[Import], floors: Mapping[str, int], package: str) -> str:
    return "\n".join(
        f"  {imp} (floor {floor_of(imp.source, floors, package)} -> "
        f"{floor_of(imp.target, floors, package)})"
        for imp in imps
    )


# --- gpucheck -----------------------------------------------------------------------------


@functools.cache
def _gpucheck_graph() -> tuple[dict[str, Path], list[Import]]:
    return import_graph(PACKAGE_DIR, PACKAGE)


def test_every_module_has_a_floor() -> None:
    modules = module_files(PACKAGE_DIR, PACKAGE)
    assert modules, f"no modules found under {PACKAGE_DIR}"
    missing = unlisted(modules, FLOORS, PACKAGE)
    assert not missing, (
        "modules without a floor; add them to the floors table FLOORS in "
        f"tests/project/test_architecture.py: {', '.join(missing)}"
    )


def test_no_import_cycles() -> None:
    _, imports = _gpucheck_graph()
    cycles = find_cycles(imports)
    assert not cycles, "import cycles (module-level imports):\n" + "\n".join(
        "  "
        + " -> ".join(f"{imp.source} (line {imp.line})" for imp in cycle)
        + f" -> {cycle[0].source}"
        for cycle in cycles
    )


def test_no_module_level_import_from_a_lower_floor_to_a_higher_one() -> None:
    _, imports = _gpucheck_graph()
    eager, _ = upward(imports, FLOORS, PACKAGE)
    assert not eager, "module-level imports from a lower floor to a higher one:\n" + _describe(
        eager, FLOORS, PACKAGE
    )


def test_lazy_upward_imports_say_why() -> None:
    _, imports = _gpucheck_graph()
    _, lazy = upward(imports, FLOORS, PACKAGE)
    assert not lazy, (
        f"function-level imports from a lower floor to a higher one without a "
        f"'# {LAZY_MARK} <why>' comment on the line or the line above:\n"
        + _describe(lazy, FLOORS, PACKAGE)
    )


def test_no_module_or_function_over_the_limits() -> None:
    """No module over :data:`MAX_LINES` lines, no function over :data:`MAX_FUNCTION_LINES`, but
    those still listed in :data:`OVER_THE_LIMITS`; and every one listed is still over."""
    root = PACKAGE_DIR.parent
    files = {p.relative_to(root).as_posix(): p for p in module_files(PACKAGE_DIR, PACKAGE).values()}
    over = over_the_limits(files)
    new = {k: n for k, n in over.items() if k not in OVER_THE_LIMITS}
    assert not new, (
        f"over the limits ({MAX_LINES} lines a module, data tables aside; {MAX_FUNCTION_LINES} "
        "a function's body): split them where their concepts part: "
        + ", ".join(f"{k} ({n})" for k, n in sorted(new.items()))
    )
    done = sorted(set(OVER_THE_LIMITS) - set(over))
    assert not done, f"no longer over the limits: remove them from OVER_THE_LIMITS: {done}"


def test_the_kernel_wing_is_fenced_off() -> None:
    _, imports = _gpucheck_graph()
    crossings = fence_crossings(imports, WING, FENCED)
    assert not crossings, (
        f"{', '.join(FENCED)} import the kernel wing ({', '.join(WING)}), even lazily:\n"
        + "\n".join(f"  {imp}" for imp in crossings)
    )


def test_no_private_name_is_used_across_modules() -> None:
    uses = private_uses(module_files(PACKAGE_DIR, PACKAGE), PACKAGE)
    assert not uses, (
        "private names used outside their module (make them public, or move the user):\n"
        + "\n".join(f"  {u}" for u in uses)
    )


# --- records typed past their reader -----------------------------------------------------
#
# A record that crosses a process boundary is read once, by its reader in ``model/``
# (``from_json``: where a record someone else wrote is judged), into typed objects; past that
# reader nobody indexes its payload as a dict. Measured on the code: a ``.get(key)`` or
# ``.setdefault(key)`` call, or a ``.pop("...")`` call or a ``["..."]`` subscript with a
# string constant for a key, on an attribute named like a payload field of a model record
# (``record.memory``,
# ``header.config``, ``record.findings``...), in any module outside ``gpucheck/model/``. The
# payload fields are found, not listed: every field of a dataclass of ``gpucheck.model`` whose
# type is (a list, a dict or an optional of) another dataclass of ``gpucheck.model``. Dicts
# that are data, not records (``cost_s``: names to seconds), are of no model type, and
# ``RunHeader.raw`` is the record as written, read through ``RunHeader.field``.


def model_records(package: str) -> set[type]:
    """The dataclasses the modules of ``<package>.model`` define."""
    import dataclasses
    import importlib
    import pkgutil

    model = importlib.import_module(f"{package}.model")
    found = set()
    for info in pkgutil.iter_modules(model.__path__):
        module = importlib.import_module(f"{model.__name__}.{info.name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and dataclasses.is_dataclass(obj)
                and obj.__module__ == module.__name__
            ):
                found.add(obj)
    return found


def payload_fields(records: set[type]) -> set[str]:
    """The names of the fields of ``records`` whose type names another of ``records``."""
    import dataclasses
    import typing

    def names_a_record(tp: object) -> bool:
        if isinstance(tp, (list, tuple)):  # a Callable's parameters
            return any(names_a_record(a) for a in tp)
        return tp in records or any(names_a_record(a) for a in typing.get_args(tp))

    out = set()
    for cls in records:
        hints = typing.get_type_hints(cls)
        out |= {f.name for f in dataclasses.fields(cls) if names_a_record(hints[f.name])}
    return out


@dataclass(frozen=True)
class PayloadLookup:
    """A string-keyed lookup on a record's payload outside the model's readers."""

    path: Path
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def payload_lookups(paths: Iterable[Path], fields: set[str]) -> list[PayloadLookup]:
    """``X.<field>.get(k)``, ``.setdefault(k)``, ``.pop("k")`` and ``X.<field>["k"]`` in
    ``paths``, for every field name of ``fields``."""

    def on_payload(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and node.attr in fields

    def keyed(node: ast.expr) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    out = []
    for path in paths:
        source = path.read_text()
        for node in ast.walk(ast.parse(source, filename=str(path))):
            found = (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and on_payload(node.func.value)
                and bool(node.args)
                and (
                    node.func.attr in ("get", "setdefault")
                    or (node.func.attr == "pop" and keyed(node.args[0]))
                )
            ) or (isinstance(node, ast.Subscript) and on_payload(node.value) and keyed(node.slice))
            if found:
                text = ast.get_source_segment(source, node) or ""
                out.append(PayloadLookup(path, node.lineno, text))
    return out


def test_no_record_payload_is_read_as_a_dict_past_its_reader() -> None:
    fields = payload_fields(model_records(PACKAGE))
    assert {"memory", "numerics", "distributed", "config", "findings"} <= fields
    model = PACKAGE_DIR / "model"
    paths = [p for p in module_files(PACKAGE_DIR, PACKAGE).values() if model not in p.parents]
    found = payload_lookups(paths, fields)
    assert not found, (
        "a record's payload read as a dict past its reader in gpucheck/model/ (give the "
        "model's class the attribute, and read that):\n" + "\n".join(f"  {x}" for x in found)
    )


def test_synthetic_payload_lookups_are_found(tmp_path: Path) -> None:
    path = tmp_path / "reader.py"
    path.write_text(
        "def f(record, header, item, costs):\n"
        "    a = record.memory.get('torch_peak_allocated')\n"
        "    b = header.config['suites']\n"
        "    c = record.memory.torch_peak_allocated\n"  # typed: fine
        "    d = item.config.getoption('x')\n"  # not a lookup
        "    e = record.cost_s['record'] + record.memory.get(k)\n"  # data; any key
        "    return record.findings[0], a, b, c, d, e\n"  # an index, not a key
    )
    found = payload_lookups([path], {"memory", "config", "findings"})
    assert [(x.line, x.text) for x in found] == [
        (2, "record.memory.get('torch_peak_allocated')"),
        (3, "header.config['suites']"),
        (6, "record.memory.get(k)"),
    ]


# --- the measuring functions, on a synthetic package --------------------------------------


def _package(root: Path, files: Mapping[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


SYNTH_FLOORS = {"pkg": 0, "pkg.low": 1, "pkg.sub": 1, "pkg.high": 2}


def test_synthetic_cycle_is_found(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "import os\nfrom pkg import high\n",
            "high.py": "from . import low\n",
            "sub/__init__.py": "",
        },
    )
    modules, imports = import_graph(pkg, "pkg")
    assert set(modules) == {"pkg", "pkg.low", "pkg.high", "pkg.sub"}
    cycles = find_cycles(imports)
    assert [[(i.source, i.line, i.target) for i in c] for c in cycles] == [
        [("pkg.high", 1, "pkg.low"), ("pkg.low", 2, "pkg.high")]
    ]


def test_synthetic_type_only_cycle_is_found(tmp_path: Path) -> None:
    """A split whose halves import each other, one only for a type, is a cycle."""
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "spec.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.api import Runner\nelse:\n    import os\n",
            "api.py": "from pkg.spec import Spec\n",
        },
    )
    _, imports = import_graph(pkg, "pkg")
    [typed] = [i for i in imports if i.source == "pkg.spec"]
    assert (typed.target, typed.type_only, typed.lazy) == ("pkg.api", True, False)
    assert [[(i.source, i.target) for i in c] for c in find_cycles(imports)] == [
        [("pkg.api", "pkg.spec"), ("pkg.spec", "pkg.api")]
    ]
    # upward, it is judged as a lazy one: it needs a `lazy:` comment saying why
    assert upward(imports, {"pkg": 0, "pkg.spec": 1, "pkg.api": 2}, "pkg") == ([], [typed])


def test_synthetic_fence(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "kernels/__init__.py": "",
            "kernels/op.py": "",
            "harness.py": "def f():\n    from pkg.kernels import op  # lazy: still over\n",
            "entry.py": "from pkg.kernels import op\n",
        },
    )
    _, imports = import_graph(pkg, "pkg")
    crossed = fence_crossings(imports, ["pkg.kernels"], ["pkg.harness"])
    assert [(i.source, i.target) for i in crossed] == [("pkg.harness", "pkg.kernels.op")]


def test_synthetic_private_names(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "_HIDDEN = 1\nPUBLIC = 2\ndef _helper():\n    return _HIDDEN\n",
            "high.py": (
                "from pkg.low import PUBLIC, _HIDDEN\n"  # 1: a private name imported
                "from pkg import low, _ext\n"  # 2: a private module: fine
                "import pkg.low as lo\n"
                "x = low._helper()\n"  # 4: reached through the module
                "y = lo._HIDDEN + _ext.f()\n"  # 5: through an alias; _ext's own: not defined
                "z = low.__name__\n"  # 6: a dunder: fine
            ),
            "_ext.py": "",
        },
    )
    uses = private_uses(module_files(pkg, "pkg"), "pkg")
    assert [(u.source, u.line, u.target, u.name) for u in uses] == [
        ("pkg.high", 1, "pkg.low", "_HIDDEN"),
        ("pkg.high", 4, "pkg.low", "_helper"),
        ("pkg.high", 5, "pkg.low", "_HIDDEN"),
    ]


def test_synthetic_lazy_import_makes_no_cycle(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "def f():\n    from pkg import high  # lazy: optional\n",
            "high.py": "from pkg.low import f\n",
        },
    )
    _, imports = import_graph(pkg, "pkg")
    assert find_cycles(imports) == []


def test_synthetic_floors(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "NAME = 1\n",
            "low.py": (
                "import pkg.high\n"  # 1: upward, module level
                "from pkg import NAME, sub\n"  # 2: pkg and pkg.sub: fine
                "def f():\n"
                "    from pkg import high\n"  # 4: lazy, uncommented
                "    # lazy: only for the optional report\n"
                "    from pkg.high import g\n"  # 6: lazy, commented above
                "    from .high import (g,  # lazy: optional\n"
                "                       h)\n"
            ),  # 7: lazy, commented inside
            "high.py": "from pkg.low import f\nfrom .sub.deep import x\n",  # downward: fine
            "sub/__init__.py": "",
            "sub/deep.py": "from .. import low\nfrom ..high import y\n",  # 1 fine, 2 upward
        },
    )
    modules, imports = import_graph(pkg, "pkg")
    targets = {(i.source, i.line): i.target for i in imports}
    assert {i.target for i in imports if i.source == "pkg.low" and i.line == 2} == {
        "pkg",
        "pkg.sub",
    }
    assert targets[("pkg.sub.deep", 1)] == "pkg.low"
    assert targets[("pkg.high", 2)] == "pkg.sub.deep"
    assert unlisted(modules, SYNTH_FLOORS, "pkg") == []
    assert floor_of("pkg.sub.deep", SYNTH_FLOORS, "pkg") == 1
    eager, lazy = upward(imports, SYNTH_FLOORS, "pkg")
    assert [(i.source, i.line, i.target) for i in eager] == [
        ("pkg.low", 1, "pkg.high"),
        ("pkg.sub.deep", 2, "pkg.high"),
    ]
    assert [(i.source, i.line, i.target) for i in lazy] == [("pkg.low", 4, "pkg.high")]


def test_synthetic_unlisted(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {"__init__.py": "", "low.py": "x = 1\n", "other.py": "x = 1\n"})
    modules = module_files(pkg, "pkg")
    # the package itself does not give its floor to its modules
    assert unlisted(modules, {"pkg": 0, "pkg.low": 1}, "pkg") == ["pkg.other"]


def test_synthetic_limits_count_code_not_docstrings_or_data_tables(tmp_path: Path) -> None:
    body = "    x = 1\n" * MAX_FUNCTION_LINES
    deeper = "    " + body.replace("\n", "\n    ").rstrip(" ") + "        y = 2\n"
    doc = '    """A docstring\n' + "    of many lines\n" * 20 + '    """\n'
    table = "TABLE = {\n" + "    1: 2,\n" * MAX_LINES + "}\n"
    pkg = _package(
        tmp_path,
        {
            "long.py": "x = 1\n" * (MAX_LINES + 1),
            "fits.py": "x = 1\n" * MAX_LINES + table,  # the table does not count
            "funcs.py": (
                f"def fits():\n{doc}{body}"  # the docstring does not count
                f"class C:\n    def over(self):\n{deeper}"
                f"def outer():\n    def inner():\n{deeper}"
            ),
        },
    )
    files = {p.name: p for p in pkg.iterdir()}
    assert over_the_limits(files) == {
        "long.py": MAX_LINES + 1,
        "funcs.py::C.over": MAX_FUNCTION_LINES + 1,
        "funcs.py::outer": MAX_FUNCTION_LINES + 2,
        "funcs.py::outer.inner": MAX_FUNCTION_LINES + 1,
    }


def test_the_floor_table_of_docs_architecture_is_the_code_s():
    """docs/architecture.md's floor table names each part of FLOORS once, on its floor."""
    import re

    doc = (PACKAGE_DIR.parent / "docs" / "architecture.md").read_text()
    table: dict[str, int] = {}
    for floor, parts in re.findall(r"^\| (\d+) \| ([^|]+) \|", doc, re.M):
        for name in re.findall(r"`([\w.]+)`", parts):
            full = PACKAGE if name == PACKAGE else f"{PACKAGE}.{name}"
            assert full not in table, f"{name} is in the floor table twice"
            table[full] = int(floor)
    assert table == FLOORS
