"""The detector registry: gpucheck's own detectors and the kinds of finding they declare, and
those another package adds through the ``gpucheck`` entry point group (here: a real
distribution on sys.path, found by importlib.metadata the way an installed package is)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

from clirun import gpucheck

from gpucheck.detectors import registry, worker_detectors
from gpucheck.detectors.base import DISABLE_ENV, BaseDetector, CaseInfo
from gpucheck.model.kinds import DIAGNOSIS, SYMPTOM, Kind
from gpucheck.model.results import CaseRecord, Finding
from gpucheck.model.runlog import RunHeader

REPO = Path(__file__).resolve().parents[2]


def test_builtin_worker_and_run_detectors_have_distinct_names():
    worker = registry.worker_detectors()
    names = [d.name for d in worker]
    assert len(names) == len(set(names)) >= 9
    assert {"mixed-devices", "wrong-stream", "leak", "checkpoint-reads"} <= set(names)
    run = registry.run_detectors(registry.RunContext({"GPU-x": "cuda:0"}, {"cuda:0": 1 << 30}))
    assert [d.name for d in run][:1] == ["wrong-device"]
    assert {"stray-context", "oom-anomaly", "memory-growth", "imbalance", "numerics"} <= {
        d.name for d in run
    }


def test_the_disable_variable_leaves_detectors_out(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "leak, wrong-stream")
    names = {d.name for d in registry.worker_detectors()}
    assert "leak" not in names and "wrong-stream" not in names and "mixed-devices" in names
    monkeypatch.setenv(DISABLE_ENV, "all")
    assert registry.worker_detectors() == []


def test_run_context_comes_from_the_run_header():
    ctx = registry.RunContext.of_header(
        RunHeader.from_json(
            {
                "run_id": "r",
                "devices": [
                    {"device": "cuda:0", "uuid": "GPU-a", "memory_total": 80},
                    {"device": "cuda:1", "uuid": "GPU-b", "memory_total": None},
                ],
            }
        )
    )
    assert ctx.device_names == {"GPU-a": "cuda:0", "GPU-b": "cuda:1"}
    assert ctx.memory_totals == {"cuda:0": 80}


class _Shouting(BaseDetector):
    name = "shouting"

    def case_finished(self, case: CaseInfo) -> list[Finding]:
        return [
            Finding(
                kind="shouting",
                severity="warning",
                message="loud",
                device=case.device,
                suite=case.suite,
                case=case.case,
            )
        ]


def test_a_plugin_object_adds_worker_and_run_detectors():
    class Hooks:
        @registry.hookimpl
        def gpucheck_worker_detectors(self):
            return [_Shouting()]

        @registry.hookimpl
        def gpucheck_run_detectors(self, context):
            return [_Shouting()]

    pm = registry.manager()
    plugin = Hooks()
    pm.register(plugin, "test-shouting")
    try:
        worker = registry.worker_detectors()
        assert worker[-1].name == "shouting" and worker[0].name == "mixed-devices"
        assert registry.run_detectors(registry.RunContext())[-1].name == "shouting"
    finally:
        pm.unregister(plugin)
    assert "shouting" not in {d.name for d in registry.worker_detectors()}


def test_an_installed_package_adds_a_detector_through_its_entry_point(tmp_path: Path):
    """A distribution with an entry point in group ``gpucheck`` (a dist-info folder on
    sys.path, as pip leaves it): a fresh process sees its detector in the registry."""
    site = tmp_path / "site"
    (site / "loud_hooks").mkdir(parents=True)
    (site / "loud_hooks" / "__init__.py").write_text(
        textwrap.dedent("""
        from gpucheck.detectors import BaseDetector, hookimpl

        class Loud(BaseDetector):
            name = "loud"

        @hookimpl
        def gpucheck_worker_detectors():
            return [Loud()]
    """)
    )
    info = site / "loud_hooks-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: loud-hooks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[gpucheck]\nloud = loud_hooks\n")
    code = (
        "from gpucheck.detectors import registry; "
        "print(','.join(d.name for d in registry.worker_detectors()))"
    )
    env = {"PYTHONPATH": f"{site}:{REPO}", "PATH": "/usr/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    names = out.stdout.strip().split(",")
    assert names[-1] == "loud" and "mixed-devices" in names


def test_every_worker_detector_has_a_name_and_the_hooks():
    for d in worker_detectors():
        assert d.name and callable(d.case_started) and callable(d.case_finished)
        assert d.run_finished([]) == []


def test_the_checkpoint_detectors_come_through_the_entry_point_group():
    """gpucheck's checkpoint detectors are registered as a third party's are: an entry point
    in group ``gpucheck`` of pyproject.toml (the registry's fallback for a run without the
    installed metadata names the same module), after the built-in ones."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"][registry.ENTRY_POINT_GROUP]
    assert declared == registry.OWN_ENTRY_POINTS
    pm = registry.manager()
    for name, module in declared.items():
        assert pm.get_plugin(name).__name__ == module
    names = [d.name for d in registry.worker_detectors()]
    assert names[-2:] == ["double-activation", "checkpoint-reads"]
    assert names.index("leak") < names.index("double-activation")


def test_numerics_listens_outside_the_launch_traces_windows():
    """Listeners run in the detectors' order before a call and in reverse after it: numerics
    comes before the two detectors of the launch trace, so its hashing kernels run before a
    window opens and after it closes, not inside the op's span."""
    names = [d.name for d in registry.worker_detectors()]
    assert names.index("numerics") < min(names.index("wrong-stream"), names.index("kernel-device"))


def test_the_unwritten_probe_runs_after_the_trace_and_before_numerics_reads_its_evidence():
    """After a call, listeners run last first: the unwritten-output probe's re-runs come after
    the launch trace marked the call's end, and before numerics hashes the call's outputs
    (numerics reads the probe's evidence of that call)."""
    names = [d.name for d in registry.worker_detectors()]
    assert names.index("numerics") < names.index("unwritten-output") < names.index("wrong-stream")


def test_the_pending_error_probe_runs_after_the_launch_traces_windows_close():
    """Detectors finish a case in their order: pending-error's probe launch comes after the
    launch trace's two have closed its windows, so no window records it as an op's launch."""
    names = [d.name for d in registry.worker_detectors()]
    assert names.index("pending-error") > max(
        names.index("wrong-stream"), names.index("kernel-device")
    )


def _package(site: Path, name: str, hooks: str) -> None:
    """An installed distribution ``name`` (a dist-info folder on sys.path, as pip leaves it)
    whose entry point in group ``gpucheck`` is its hook module ``hooks``."""
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(textwrap.dedent(hooks))
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[gpucheck]\n{name} = {name}\n")


#: a package's detector and the kind it declares: a cause that explains its case's failure
#: even as a warning, before every built-in root cause, with a hint of its own
TOY_HOOKS = """
    from gpucheck.detectors import BaseDetector, hookimpl
    from gpucheck.model.kinds import Kind
    from gpucheck.model.results import Finding

    TOY_CAUSE = Kind(
        "toy-cause",
        precedence=1,
        explains_as_warning=True,
        hint="look at the toy op's bounds",
        title="Toy causes",
    )

    class Toy(BaseDetector):
        name = "toy"
        kinds = (TOY_CAUSE,)

        def case_finished(self, case):
            if "bad" not in case.case:
                return []
            return [Finding(TOY_CAUSE.name, "warning", "the toy op misbehaved", device=case.device,
                            suite=case.suite, case=case.case, op="toy.op")]

    @hookimpl
    def gpucheck_worker_detectors():
        return [Toy()]

    @hookimpl
    def gpucheck_finding_kinds():
        return list(Toy.kinds)
"""
TOY_SUITE = """
def test_fine():
    assert 1 + 1 == 2

def test_bad():
    assert 1 + 1 == 3
"""


def test_every_builtin_kind_is_declared_once_with_one_place():
    """Each kind has one declaration (a second one of a name is never gpucheck's own), and no
    two kinds with a place share it."""
    declared = registry.Builtin().gpucheck_finding_kinds()
    by_name: dict[str, Kind] = {}
    for kind in declared:
        assert by_name.setdefault(kind.name, kind) is kind, f"{kind.name} declared twice"
    places = [k.precedence for k in by_name.values() if k.precedence is not None]
    assert len(places) == len(set(places))
    table = registry.kinds()
    assert all(table.of(name) is kind for name, kind in by_name.items())
    assert {n for n, k in by_name.items() if k.role == SYMPTOM} == {
        "crash",
        "hang",
        "cuda-error",
        "sanitizer",
        "test-failure",
        "worker-error",
        "oom",
        "detector-error",
        "sanitizer-crash",
        "sanitizer-limit",
        "nvml-error",
    }
    assert "double-activation" in table.precedence  # the kernel wing's, through its entry point


def test_a_kind_nobody_declares_is_a_diagnosis_without_a_place():
    record = CaseRecord("r", "cpu", "s", "t.py::x", "blocking", "failed")
    table = registry.kinds()
    assert table.role(Finding("my-own-check", "error", "x"), record) == DIAGNOSIS
    assert table.rank("my-own-check") == len(table.precedence)
    assert table.of("my-own-check").heading == "My own check"


def test_a_package_declares_its_kind_and_the_report_ranks_by_it(tmp_path: Path):
    """A package's detector (through the entry point group) makes a finding of a kind it
    declares: a warning that explains its case's failure, first among the root causes. A real
    CPU run records it in the worker, and the reports lead the failing case with it and fold
    the failing assert under it, with the kind's hint where the finding has none."""
    site = tmp_path / "site"
    _package(site, "toy_hooks", TOY_HOOKS)
    suite = tmp_path / "suites" / "toy"
    suite.mkdir(parents=True)
    (suite / "test_toy.py").write_text(TOY_SUITE)
    out = tmp_path / "out"
    proc = gpucheck(
        "run", "--cpu-only", "--quiet", "--out", out, "--format", "json", "--format", "junit",
        "--format", "sarif", cwd=tmp_path, env={"PYTHONPATH": f"{site}:{REPO}"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    (lead,) = doc["diagnoses"]
    assert (lead["kind"], lead["subject"], lead["severity"]) == ("toy-cause", "toy.op", "warning")
    assert [s["kind"] for s in lead["explains"]] == ["test-failure"]
    assert doc["symptoms"] == []
    failure = next(ET.parse(out / "junit.xml").getroot().iter("failure"))
    assert failure.get("message", "").startswith("toy-cause: the toy op misbehaved")
    rules = json.loads((out / "results.sarif").read_text())["runs"][0]["tool"]["driver"]
    toy = next(r for r in rules["rules"] if r["id"] == "toy-cause")
    assert (toy["name"], toy["help"]["text"]) == ("Toy causes", "look at the toy op's bounds")


def _literal_kinds(node: ast.expr) -> list[str]:
    """The kind names a finding's first argument can be, where the source spells them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _literal_kinds(node.body) + _literal_kinds(node.orelse)
    return []


def test_every_kind_the_package_makes_a_finding_of_is_declared():
    """A finding made with a kind spelled in place (``case.finding("leak", ...)``,
    ``Finding("oom", ...)``) names a kind some maker declares: a misspelled kind would be a
    diagnosis without a place, ranked last in the report."""
    package = Path(registry.__file__).resolve().parent.parent
    declared = {k.name for k in registry.Builtin().gpucheck_finding_kinds()}
    declared |= set(registry.kinds().by_name)  # the kernel wing's, through its entry point
    used: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("finding", "Finding"):
                for kind in _literal_kinds(node.args[0]):
                    used.setdefault(kind, f"{path.relative_to(package)}:{node.lineno}")
    assert len(used) > 10  # the walk sees the package's findings
    undeclared = {k: where for k, where in used.items() if k not in declared}
    assert not undeclared, f"kinds used but declared by no maker: {undeclared}"
