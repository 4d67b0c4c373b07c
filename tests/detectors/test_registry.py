"""The detector registry: gpucheck's own detectors, and those another package adds through the
``gpucheck`` entry point group (here: a real distribution on sys.path, found by
importlib.metadata the way an installed package is)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from gpucheck.detectors import registry, worker_detectors
from gpucheck.detectors.base import DISABLE_ENV, BaseDetector, CaseInfo
from gpucheck.model.results import Finding
from gpucheck.model.runlog import RunHeader


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
    env = {"PYTHONPATH": f"{site}:{Path(__file__).resolve().parents[2]}", "PATH": "/usr/bin"}
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
