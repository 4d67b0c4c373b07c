"""`python -m nox -s tests` from a user's venv that has torch: the session's venv sees that
venv's packages (after its own), so torch is not downloaded again; outside a venv (CI) there
is nothing to share; of a venv that holds gpucheck itself (the wheel README installs),
everything but gpucheck is shared. `nox -s tests -- FILE` runs FILE alone; the README
session holds every torch to the CPU build."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _noxfile() -> ModuleType:
    """noxfile.py, loaded once (loading registers its sessions with nox)."""
    spec = importlib.util.spec_from_file_location("gpucheck_noxfile", ROOT / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _venv(where: Path, *options: str) -> tuple[Path, Path]:
    """A venv without pip: its python and its site-packages."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", *options, str(where)],
        check=True,
        timeout=120,
    )
    python = where / "bin" / "python"
    return python, _noxfile().tool("fresh_venv").site_packages(python)


def _shared_by_noxfile(python: Path | str) -> list[str]:
    """What the noxfile shares when nox runs under ``python`` (nox and what it needs
    importable through PYTHONPATH, as if installed there: every folder this interpreter
    imports from, wherever the base interpreter keeps nox's dependencies)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *(p for p in sys.path if p and Path(p).is_dir())]
        ),
    }
    out = subprocess.run(
        [
            str(python),
            "-c",
            "import json, noxfile; print(json.dumps(noxfile.outer_site_packages()))",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _where(python: Path, *modules: str) -> list[str]:
    code = (
        "; ".join(f"import {m}" for m in modules)
        + "; print("
        + ", ".join(f"{m}.WHERE" for m in modules)
        + ")"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    return out.stdout.split() if out.returncode == 0 else ["ImportError"]


def test_a_session_venv_sees_the_outer_venv_after_its_own(tmp_path):
    outer, outer_lib = _venv(tmp_path / "outer")
    (outer_lib / "outer_only.py").write_text("WHERE = 'outer'\n")  # stands in for torch
    (outer_lib / "both.py").write_text("WHERE = 'outer'\n")
    session, session_lib = _venv(tmp_path / "session", "--system-site-packages")
    (session_lib / "both.py").write_text("WHERE = 'session'\n")
    assert _where(session, "outer_only") == ["ImportError"]  # --system-site-packages alone

    shared = _shared_by_noxfile(outer)
    assert str(outer_lib) in shared
    pth = _noxfile().write_outer_pth(session_lib, shared)
    assert pth is not None and pth.parent == session_lib
    assert _where(session, "outer_only", "both") == ["outer", "session"]


def test_outside_a_venv_there_is_nothing_to_share(tmp_path):
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    if not base.exists():
        pytest.skip(f"no base interpreter at {base}")
    assert _shared_by_noxfile(base) == []
    _, session_lib = _venv(tmp_path / "session")
    stale = session_lib / _noxfile().OUTER_PTH
    stale.write_text("/somewhere\n")  # from an earlier run in a venv
    assert _noxfile().write_outer_pth(session_lib, []) is None and not stale.exists()


def test_a_venv_holding_gpucheck_is_shared_without_gpucheck(tmp_path):
    """The venv README's Install made holds torch and gpucheck's wheel: the session sees its
    torch, never its gpucheck (which would shadow the session's editable install of the
    checkout), under the distribution's name or the older one."""
    _, outer_lib = _venv(tmp_path / "outer")
    (outer_lib / "outer_only.py").write_text("WHERE = 'outer'\n")  # stands in for torch
    for name in ("gpucheck", "torch_gpucheck-0.1.0.dist-info", "gpucheck-0.1.0.dist-info"):
        (outer_lib / name).mkdir()
    (outer_lib / "gpucheck" / "__init__.py").write_text("WHERE = 'outer'\n")
    (outer_lib / "__editable___torch_gpucheck_0_1_0_finder.py").write_text("")
    session, session_lib = _venv(tmp_path / "session")
    pth = _noxfile().write_outer_pth(session_lib, [str(outer_lib)])
    assert pth is not None
    links = tmp_path / "session" / _noxfile().OUTER_LINKS
    # looked at before anything is imported through them (Python writes its __pycache__ there)
    assert sorted(p.name for p in links.iterdir()) == ["outer_only.py"]
    assert _where(session, "outer_only") == ["outer"]
    assert _where(session, "gpucheck") == ["ImportError"]
    (outer_lib / "outer_only.py").unlink()  # written again each time: nothing stale
    assert _noxfile().write_outer_pth(session_lib, [str(outer_lib)]) is not None
    assert not list(links.iterdir()) and (outer_lib / "gpucheck").is_dir()  # links only


def test_nox_tests_with_a_file_runs_that_file_alone(tmp_path, monkeypatch):
    targets = _noxfile().pytest_targets
    monkeypatch.chdir(ROOT)
    assert targets([], ("tests",)) == ["tests"]
    assert targets(["-x", "-k", "readme"], ("tests",)) == ["tests"]
    assert targets(["tests/project/test_noxfile.py"], ("tests",)) == []
    assert targets(["tests/cli/test_cli.py::test_version", "-x"], ("tests",)) == []


def test_the_readme_session_holds_every_torch_to_one_pinned_build():
    constraint = _noxfile().torch_constraint
    assert constraint("torch==2.13.0") == "torch==2.13.0"
    for loose in ("torch", "torch>=2.4", "/wheels/torch.whl", "torch==2.13.0; numpy"):
        with pytest.raises(ValueError, match="must pin one torch"):
            constraint(loose)


def test_the_quick_and_smoke_sets_name_test_files_that_exist_and_are_documented():
    noxfile = _noxfile()
    root = Path(noxfile.__file__).resolve().parent
    for name in (*noxfile.QUICK, *noxfile.SMOKE):
        assert (root / name).is_file(), name
    slowest = {
        "tests/controller/test_run_output.py",
        "tests/distributed/test_dist_run.py",
        "tests/project/test_packaging.py",
        "tests/kernels/test_ssim_reference.py",
        "tests/detectors/test_ext_watch.py",
        "tests/controller/test_faults.py",
    }
    assert not slowest & set(noxfile.QUICK)  # each takes minutes on two cores
    for node in noxfile.QUICK_LEAVES_OUT:  # single slow tests of the quick files, deselected
        file, _, test = node.partition("::")
        assert file in noxfile.QUICK and f"def {test}(" in (root / file).read_text(), node
    readme = (root / "README.md").read_text()
    assert "python -m nox -s quick" in readme and "| `quick` |" in readme
