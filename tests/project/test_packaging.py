"""gpucheck as a package users install: the sdist and the wheel carry the CUDA sources (and
with them the defect builds), the suites, the worked example and the report's templates; a
wheel installed outside the checkout runs its bundled suites from any folder and writes
nothing beside itself; setup.py installs without the kernels, in one line, when their build
fails."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from gpucheck import _resources
from gpucheck._csrc import compile_check, defects

ROOT = Path(__file__).resolve().parents[2]
#: what building gpucheck reads from the repository
SOURCE = (
    "gpucheck",
    "csrc",
    "suites",
    "examples",
    "docs",
    "setup.py",
    "pyproject.toml",
    "MANIFEST.in",
    "README.md",
)
IGNORE = shutil.ignore_patterns(
    "__pycache__", "*.py[cod]", "*.so", "*.egg-info", "build", "reports"
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(wheel, sdist, the source tree they were built from): the sdist built from a copy of
    the repository, the wheel from the sdist (what `python -m build` does), no kernels."""
    work = tmp_path_factory.mktemp("packaging")
    src = work / "src"
    for name in SOURCE:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=IGNORE)
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    env = {**os.environ, "GPUCHECK_NO_EXTENSION": "1"}  # a GPU machine would build kernels
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(work / "dist"), str(src)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheel = next((work / "dist").glob("torch_gpucheck-*.whl"))
    sdist = next((work / "dist").glob("torch_gpucheck-*.tar.gz"))
    return wheel, sdist, src


def shipped(src: Path) -> set[str]:
    """Every file the package must carry, as its path inside the installed package: its
    modules, the bundled folders' sources, the files of the defect builds and of the builds
    gpucheck compile-checks, the report's templates and schema."""
    suffixes = {".py", ".h", ".cuh", ".cpp", ".cu", ".md", ".sh", ".toml"}
    want = {
        f"gpucheck/{package}/{f.relative_to(src / folder).as_posix()}"
        for package, folder in _resources.BUNDLED.items()
        for f in (src / folder).rglob("*")
        if f.is_file() and f.suffix in suffixes and "__pycache__" not in f.parts
    }
    csrc = _resources.csrc()
    for defect in defects.DEFECTS:
        want |= {
            f"gpucheck/csrc/{f.relative_to(csrc).as_posix()}"
            for f in defects.defect_sources(defect)
        }
    want |= {
        f"gpucheck/{f.relative_to(csrc.parent).as_posix()}"
        for f in compile_check.check_only_sources()
    }  # the selftest's and the example's
    want |= {  # the package's own modules, the kernels' homes among them
        f.relative_to(src).as_posix()
        for f in (src / "gpucheck").rglob("*.py")
        if "__pycache__" not in f.parts
    }
    want |= {
        f"gpucheck/report/templates/{f.name}"
        for f in (src / "gpucheck/report/templates").iterdir()
        if f.is_file()
    }
    return want | {
        "gpucheck/model/results.schema.json",
        "gpucheck/model/report.schema.json",
        "gpucheck/_resources.py",
        "gpucheck/__main__.py",
        "gpucheck/detectors/launch_callbacks.cpp",  # built on first use by the launch trace
    }


def test_the_wheel_carries_sources_suites_example_and_templates(built):
    wheel, _, src = built
    names = set(zipfile.ZipFile(wheel).namelist())
    want = shipped(src)
    for must in (
        "gpucheck/csrc/registration.cpp",
        "gpucheck/csrc/knn/knn_cuda.cu",
        "gpucheck/kernels/knn/op.py",
        "gpucheck/kernels/knn/defects.py",
        "gpucheck/suites/knn/test_knn.py",
        "gpucheck/suites/knn/suite.toml",
        "gpucheck/suites/dist/dist_checks.py",
        "gpucheck/suites/selftest/conftest.py",
        "gpucheck/suites/selftest/defects.cu",
        "gpucheck/examples/custom_rnn_extension/csrc/wkv_cuda.cu",
        "gpucheck/examples/custom_rnn_extension/custom_rnn/__init__.py",
        "gpucheck/examples/custom_rnn_extension/tests/test_wkv.py",
        "gpucheck/examples/custom_rnn_extension/README.md",
        "gpucheck/report/templates/report.html.j2",
    ):
        assert must in want
    assert sorted(want - names) == []
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".so"))]


def test_the_sdist_carries_them_in_the_repository_layout(built):
    _, sdist, src = built
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    folders = {
        f"gpucheck/{package}/": f"{folder}/" for package, folder in _resources.BUNDLED.items()
    }
    want = set()
    for name in shipped(src):
        prefix = next((p for p in folders if name.startswith(p)), None)
        want.add(folders[prefix] + name[len(prefix) :] if prefix else name)
    assert "csrc/ssim/ssim.cpp" in want and "suites/selftest/defects.cpp" in want
    assert sorted(want - names) == []
    assert {"setup.py", "pyproject.toml", "MANIFEST.in", "README.md"} <= names


def _venv_with_wheel(wheel: Path, where: Path) -> tuple[Path, Path]:
    """A fresh venv outside the checkout with ``wheel`` installed; its dependencies (torch,
    pytest, ...) are this interpreter's, shown to it after its own packages. Returns its
    bin/ folder and the installed package's folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (purelib / "deps.pth").write_text("".join(f"{p}\n" for p in sys.path if "site-packages" in p))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            str(wheel),
        ],
        check=True,
        timeout=300,
    )  # forced: a gpucheck on the shared paths is not this one
    return where / "bin", purelib / "gpucheck"


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")}


def test_an_installed_wheel_runs_its_bundled_suites_from_any_folder(built, tmp_path):
    wheel, _, _ = built
    bin_dir, package = _venv_with_wheel(wheel, tmp_path / "venv")
    assert ROOT not in package.resolve().parents
    before = _files(package)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # Python's own caches aside
    proc = subprocess.run(
        [
            bin_dir / "gpucheck",
            "run",
            "--cpu-only",
            "--suite",
            "knn",
            "--allow-empty",
            "--out",
            str(cwd / "out"),
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = [json.loads(line) for line in (cwd / "out" / "results.jsonl").open()]
    knn = Path(records[0]["config"]["suite_paths"]["knn"])
    assert knn == (package / "suites" / "knn").resolve()
    cases = [r for r in records if r.get("record") == "case"]
    assert cases and all(r["case"].startswith("test_knn.py::") for r in cases)
    assert {r["status"] for r in cases} == {"skipped"}
    assert _files(package) == before  # nothing written beside the installed package


def test_an_installed_suite_collects_as_in_the_checkout(built, tmp_path):
    """The same case ids and the selftest's conftest, from the installed package."""
    wheel, _, _ = built
    bin_dir, package = _venv_with_wheel(wheel, tmp_path / "venv")

    def collect(python: Path | str, suite: Path) -> tuple[list[str], str]:
        args = [str(python), "-m", "pytest", str(suite), "-p", "no:cacheprovider"]
        ids = subprocess.run(
            [*args, "--collect-only", "-q"],
            cwd=tmp_path,
            text=True,
            capture_output=True,
            timeout=300,
        ).stdout
        fixtures = subprocess.run(
            [*args, "--fixtures"], cwd=tmp_path, text=True, capture_output=True, timeout=300
        ).stdout
        return sorted(line.split("/")[-1] for line in ids.splitlines() if "::" in line), fixtures

    installed, fixtures = collect(bin_dir / "python", package / "suites" / "selftest")
    checkout, _ = collect(sys.executable, _resources.suites() / "selftest")
    assert installed == checkout and "test_selftest.py::test_abort[nocuda]" in installed
    where = [
        line.split(" -- ")[1]
        for line in fixtures.splitlines()
        if line.startswith("defect_ops [session scope] -- ")
    ]
    assert (
        where
        and (tmp_path / where[0].split(":")[0]).resolve()
        == (package / "suites" / "selftest" / "conftest.py").resolve()
    )


def _setup_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpucheck_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: defines, does not build
    return module


def test_a_failed_kernel_build_installs_without_them_in_one_line(tmp_path, capsys):
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    build = _setup_module().build_command(build_ext)
    dist = Distribution(
        {"name": "x", "ext_modules": [Extension("x._C", [str(tmp_path / "missing.cpp")])]}
    )
    cmd = build(dist)
    cmd.build_lib, cmd.build_temp = str(tmp_path / "lib"), str(tmp_path / "tmp")
    cmd.ensure_finalized()
    cmd.run()  # raises nothing
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpucheck: building the CUDA kernels failed (")
    assert "installing without them: they are built on first use" in err[0]
    assert cmd.extensions == [] and cmd.get_outputs() == []


class _CudaTorch(ModuleType):
    """A CUDA build of torch on a machine without a GPU (what setup.py asks of torch)."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.__version__ = "2.11.0+cu130"
        self.version = ModuleType("torch.version")
        self.version.cuda = "13.0"  # type: ignore[attr-defined]
        self.cuda = ModuleType("torch.cuda")
        self.cuda.is_available = lambda: False  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("torch", "path", "env", "said"),
    [
        *(
            (
                None,
                [isolated],
                {},
                "this build runs in an isolated build environment (pip's or `python -m "
                "build`'s), which does not see your torch; to build them at install, install "
                "torch first, then gpucheck with --no-build-isolation",
            )
            for isolated in (
                "/tmp/pip-build-env-x1/overlay/lib",  # pip install . / pip wheel .
                "/tmp/build-env-x2/lib/python3.11/site-packages",  # python -m build
            )
        ),
        (None, [], {}, "torch is not installed in this environment: install torch first"),
        (
            "cuda",
            [],
            {},
            "no GPU is visible here; set GPUCHECK_BUILD_EXTENSION=1 or "
            "TORCH_CUDA_ARCH_LIST to build them anyway",
        ),
    ],
)
def test_the_kernels_are_not_built_at_install_without_torch_or_a_gpu_and_it_says_why(
    monkeypatch, capsys, torch, path, env, said
):
    setup = _setup_module()
    for name in ("GPUCHECK_NO_EXTENSION", "GPUCHECK_BUILD_EXTENSION", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "torch", _CudaTorch() if torch else None)
    monkeypatch.setattr(sys, "path", [*path, *sys.path])
    assert setup.extension_kwargs() == {}
    assert capsys.readouterr().err.strip().splitlines() == [
        f"gpucheck: not building the CUDA kernels at install ({said}); they are built on first use"
    ]


def test_asked_for_the_kernels_are_built_at_install_without_a_gpu(monkeypatch, capsys):
    """GPUCHECK_BUILD_EXTENSION=1 (a build machine): the build goes on past the GPU check,
    to the toolkit's (none here, or a CPU-only torch's own sentence on a machine with one)."""
    setup = _setup_module()
    monkeypatch.setenv("GPUCHECK_BUILD_EXTENSION", "1")
    monkeypatch.delenv("GPUCHECK_NO_EXTENSION", raising=False)
    monkeypatch.setitem(sys.modules, "torch", _CudaTorch())
    monkeypatch.setattr(
        setup,
        "_load",
        lambda name: type("csrc", (), {"torch_build_env": staticmethod(lambda: None)}),
    )
    assert setup.extension_kwargs() == {}
    err = capsys.readouterr().err
    assert "no GPU is visible" not in err and "no CUDA toolkit found" in err
