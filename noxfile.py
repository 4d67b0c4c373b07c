"""Sessions for gpucheck's CI and maintainers: `nox -s tests lint typecheck compile` (CPU,
the default), `nox -s quick` (CPU: a subset for the edit loop), `nox -s readme` (CPU: README's
runnable blocks, each as written in a fresh venv of a fresh copy of the checkout), `nox -s
package` (CPU: the wheel and sdist, a smoke set of tests run installed), `nox -s gpu sanitize`
(need GPUs).

Sessions see the packages of the Python that runs nox, so an installed torch (a CUDA build on
GPU machines) is used as it is and never reinstalled: the base interpreter's through
--system-site-packages, and, where nox runs inside a virtual environment (a user's venv
with torch), that environment's through a .pth file in the session's venv (after the
session's own packages) naming a folder of links to them, gpucheck's own left out (the
session installs the checkout's, which must be the one imported). Where no torch is found
at all, $GPUCHECK_TORCH (default torch==2.13.0, a CPU build on our CI machines) is installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import nox
from nox.virtualenv import VirtualEnv

nox.options.sessions = ["tests", "lint", "typecheck", "compile"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

TORCH_SPEC = os.environ.get("GPUCHECK_TORCH", "torch==2.13.0")
#: set in the tests session: the Ray tests fail without Ray instead of skipping
RAY_NEEDED = "GPUCHECK_RAY_TESTS"
VENV = {"venv_params": ["--system-site-packages"]}
ROOT = Path(__file__).resolve().parent
#: what the session's interpreter reports: its version and where its packages go
_PROBE = (
    "import json, sys, sysconfig; print(json.dumps([list(sys.version_info[:2]), "
    "sysconfig.get_paths()['purelib'], [p for p in sys.path if 'site-packages' in p]]))"
)


def tool(name: str) -> ModuleType:
    """tools/<name>.py (standard library only), loaded by path: tools/ is no package."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up
    spec.loader.exec_module(module)
    return module


#: how a session's venv sees the packages of the venv nox runs in (tools/fresh_venv.py)
_FRESH_VENV = tool("fresh_venv")
OUTER_PTH, OUTER_LINKS = _FRESH_VENV.OUTER_PTH, _FRESH_VENV.OUTER_LINKS
outer_site_packages = _FRESH_VENV.outer_site_packages
write_outer_pth = _FRESH_VENV.write_outer_pth


def _probe(session: nox.Session, python: str = "python") -> tuple[tuple[int, int], Path, list[str]]:
    out = str(session.run(python, "-c", _PROBE, silent=True, external=True)).strip()
    version, purelib, sites = json.loads(out.splitlines()[-1])
    return (version[0], version[1]), Path(purelib), sites


def _share_outer_venv(session: nox.Session) -> None:
    """Show the session the packages of the venv nox runs in (the user's torch)."""
    if not isinstance(session.virtualenv, VirtualEnv):
        return  # --no-venv: the session runs in this environment itself
    version, purelib, _ = _probe(session)
    outer = outer_site_packages() if version == sys.version_info[:2] else []
    if write_outer_pth(purelib, outer) is not None:
        session.log(
            f"sharing the packages of {sys.prefix} (after the session's own; gpucheck's own "
            "left out) and its commands"
        )
        scripts = _FRESH_VENV.outer_scripts()  # py-spy, ninja, ...: after the session's own
        session.env["PATH"] = os.pathsep.join(filter(None, [scripts, os.environ.get("PATH")]))


def _ensure_torch(session: nox.Session) -> None:
    _share_outer_venv(session)
    found = session.run(
        "python",
        "-c",
        "import importlib.util as u; print(u.find_spec('torch') is not None)",
        silent=True,
    )
    if "True" not in str(found):
        session.install(TORCH_SPEC)


def _install(session: nox.Session, extras: str, build_extension: bool = False) -> None:
    _ensure_torch(session)
    if build_extension:  # the extension build must see this environment's (CUDA) torch
        session.install("setuptools>=69", "wheel")
        session.install("--no-build-isolation", "-e", f".[{extras}]")
    else:
        session.install("-e", f".[{extras}]", env={"GPUCHECK_NO_EXTENSION": "1"})


def pytest_targets(posargs: list[str], default: tuple[str, ...]) -> list[str]:
    """What pytest runs: the files, folders or node ids among ``posargs`` (``nox -s tests --
    FILE``: that file alone, not every test and it once more), else ``default``."""
    named = [a for a in posargs if not a.startswith("-") and Path(a.split("::")[0]).exists()]
    return [] if named else list(default)


@nox.session(**VENV)
def tests(session: nox.Session) -> None:
    """CPU tests: parsers, detectors, references, harness and report on real outputs, on
    every core (pytest-xdist: ``-- -n 0`` runs them in one process)."""
    # the extra ray too (a ~79 MB wheel): the --ray tests start a local Ray cluster, and
    # here a missing Ray fails them instead of skipping them (tests/test_ray.py)
    _install(session, "test,ray")
    targets = pytest_targets(session.posargs, ("tests",))
    session.run(
        "python", "-m", "pytest", "-n", "auto", *targets, *session.posargs, env={RAY_NEEDED: "1"}
    )


#: the quick subset for the edit loop (`nox -s quick`, under a minute on two cores): the
#: tests of the model, the report, the verdict, the CLI's refusals, check_op and the
#: references, without the ones that start runs of the harness, build packages or kernels
#: (whole files here, single tests in QUICK_LEAVES_OUT)
QUICK = (
    "tests/model/test_results.py",
    "tests/report/test_report_verdict.py",
    "tests/report/test_report_groups.py",
    "tests/report/test_report_sarif.py",
    "tests/sanitizer/test_sanitizer_parser.py",
    "tests/check/test_check_op.py",
    "tests/plugin/test_testing.py",
    "tests/detectors/test_registry.py",
    "tests/project/test_readme.py",
    "tests/project/test_architecture.py",
    "tests/devices/test_devices.py",
    "tests/devices/test_nvml.py",
    "tests/devices/test_nvml_sampler.py",
    "tests/checkpoints/test_checkpoint_lint.py",
    "tests/checkpoints/test_checkpoints.py",
    "tests/distributed/test_dist_analysis.py",
    "tests/kernels/test_knn_reference.py",
    "tests/kernels/test_splat_reference.py",
    "tests/kernels/test_splat_op.py",
    "tests/cli/test_cli.py",
    "tests/detectors/test_device_state.py",
    "tests/detectors/test_op_device.py",
    "tests/worker/test_detector_loop.py",
    "tests/controller/test_deaths.py",
    "tests/controller/test_passes.py",
    "tests/detectors/test_wrong_device.py",
    "tests/detectors/test_wrong_stream.py",
    "tests/detectors/test_mixed_devices.py",
    "tests/detectors/test_stray_context.py",
    "tests/detectors/test_oom_anomaly.py",
    "tests/detectors/test_memory_growth.py",
    "tests/detectors/test_imbalance.py",
    "tests/detectors/test_leak.py",
    "tests/detectors/test_double_activation.py",
    "tests/controller/test_diagnose.py",
    "tests/detectors/test_op_watch.py",
    "tests/detectors/test_numerics.py",
)
#: the tests of QUICK's files that start a run of gpucheck or a worker, or fuzz (each takes
#: seconds on two cores; `nox -s tests` runs them): deselected by `nox -s quick`
QUICK_LEAVES_OUT = (
    "tests/check/test_check_op.py::test_a_users_file_collects_one_case_per_device_and_check",
    "tests/check/test_check_op.py::test_a_correct_torch_op_passes_every_check_that_runs_on_cpu",
    "tests/check/test_check_op.py::test_gpucheck_run_cpu_only_dry_runs_a_users_check_op_suite",
    "tests/report/test_report_verdict.py::test_a_run_that_tested_nothing_is_not_clean_anywhere",
    "tests/report/test_report_verdict.py::test_every_output_states_the_same_verdict_as_the_exit_code",
    "tests/report/test_report_verdict.py::test_report_names_a_torn_results_file_and_fails",
    "tests/report/test_report_verdict.py::test_a_suite_whose_only_file_has_a_syntax_error_is_"
    "incomplete_naming_file_and_line",
    "tests/report/test_report_verdict.py::test_collection_errors_name_their_files_in_one_style_"
    "relative_to_the_folder_run_from",
    "tests/report/test_report_sarif.py::test_run_and_report_write_only_the_formats_asked",
    "tests/detectors/test_device_state.py::test_findings_flow_into_records_and_crashes_keep_the_"
    "current_device",
    "tests/detectors/test_device_state.py::test_a_pending_error_stays_with_the_case_that_left_it",
    "tests/detectors/test_double_activation.py::test_selftest_double_activation_row_on_cpu",
    "tests/detectors/test_op_device.py::test_op_device_names_the_op_through_a_real_worker",
    "tests/detectors/test_wrong_device.py::test_the_differential_rerun_runs_only_the_suspects_"
    "and_names_the_device_bug",
    "tests/detectors/test_wrong_device.py::test_no_rerun_without_a_second_device",
    "tests/distributed/test_dist_analysis.py::test_any_log_is_read_and_judged_without_raising",
    "tests/kernels/test_splat_reference.py::test_full_size_scene_forward_and_backward",
    "tests/kernels/test_splat_reference.py::test_max_bytes_catches_double_activation",
    "tests/plugin/test_testing.py::test_a_worker_reports_the_measurement",
    "tests/worker/test_detector_loop.py::test_a_case_that_lost_the_context_gets_one_note_and_no_"
    "detector_error",
    "tests/worker/test_detector_loop.py::test_a_failing_detector_is_a_warning_not_a_broken_case",
    "tests/checkpoints/test_checkpoint_lint.py::test_roundtrip_of_correct_code_passes",
    "tests/cli/test_cli.py::test_options_given_override_pyproject_settings",
    "tests/cli/test_cli.py::test_pyproject_tool_gpucheck_sets_the_runs_defaults",
    "tests/cli/test_cli.py::test_usage_errors_exit_2",
    "tests/kernels/test_splat_op.py::test_reference_gradients_match_finite_differences",
)
#: what the package session runs against the installed wheel, besides `gpucheck run` and
#: `gpucheck selftest` (the full tests run once, in the tests session): the CLI, the
#: verdict, the plugin and check_op, the packaged suites' collection
SMOKE = (
    "tests/cli/test_cli.py",
    "tests/report/test_report_verdict.py",
    "tests/plugin/test_plugin_api.py",
    "tests/check/test_check_op.py",
    "tests/controller/test_cpu_first_run.py",
)


@nox.session(**VENV, default=False)
def quick(session: nox.Session) -> None:
    """The quick subset of the CPU tests for the edit loop (the full set: `nox -s tests`)."""
    _install(session, "test")
    targets = pytest_targets(session.posargs, QUICK)
    leave_out = [f"--deselect={n}" for n in QUICK_LEAVES_OUT] if targets else []
    session.run("python", "-m", "pytest", "-n", "auto", *targets, *leave_out, *session.posargs)


#: what gpucheck says where no GPU is usable (gpucheck/devices.py): a README block for GPUs
#: that ends on it, with exit 2, ran as far as a machine without a GPU allows
NO_GPU = "No NVIDIA GPU is usable"


def fresh_copy(where: Path) -> Path:
    """The checkout as a fresh clone of it has it (its tracked files and those git does not
    ignore, uncommitted edits included), copied to ``where``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split(b"\0")):
        source = ROOT / os.fsdecode(name)
        if source.is_file():  # not a tracked file deleted in the worktree
            (where / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / os.fsdecode(name), follow_symlinks=False)
    return where


def torch_constraint(spec: str) -> str:
    """The pip constraint that holds every ``torch`` a README block asks for (a bare
    ``python -m pip install torch`` too) to ``spec``'s build: ``torch==X`` itself."""
    if not re.fullmatch(r"torch\s*==\s*[\w.+!]+", spec):
        raise ValueError(f"GPUCHECK_TORCH must pin one torch (torch==X) here, not {spec!r}")
    return spec


@nox.session(venv_backend="none", default=False)
def readme(session: nox.Session) -> None:
    """README's shell blocks as a newcomer runs them: each in a fresh venv (made with the
    Python running nox) of a fresh copy of the checkout, as written (``bash -e``). Those
    marked ``cpu`` must pass. Those marked ``gpu`` run here with torch held to the CPU build
    $GPUCHECK_TORCH (installed first, as a GPU user's CUDA torch is, and kept by the block):
    they must pass or end in gpucheck's sentence that no GPU is usable (exit 2); on a GPU
    machine, ``tools/gpu readme`` runs them. No block resolves a torch of its own: a pip
    constraint (``PIP_CONSTRAINT``) holds every ``torch`` to $GPUCHECK_TORCH."""
    blocks = tool("readme_blocks")
    try:
        constraint = torch_constraint(TORCH_SPEC)
    except ValueError as err:
        session.error(str(err))
    chosen = [*blocks.to_run("cpu"), *blocks.to_run("gpu")]
    with tempfile.TemporaryDirectory(prefix="gpucheck-readme-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(f"{constraint}\n")
        for block in chosen:
            work = Path(tmp) / f"line{block.line}"
            _run_readme_block(session, block, work, constraints)
            shutil.rmtree(work, ignore_errors=True)  # a venv with torch: a gigabyte each


def _run_readme_block(session: nox.Session, block: Any, work: Path, constraints: Path) -> None:
    session.log(f"README.md:{block.line} ({block.kind}): a fresh copy, a fresh venv")
    clone = fresh_copy(work / "clone")
    venv = work / "venv"
    session.run(sys.executable, "-m", "venv", str(venv), external=True, silent=True)
    python = str(venv / "bin" / "python")
    env = {
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(venv),
        "PIP_CONSTRAINT": str(constraints),
        # one retry: where an index cannot be reached (PyTorch's from CI machines, which take
        # the CPU torch from their own disk), pip's five cost minutes a block
        "PIP_RETRIES": "1",
        "PYTHONNOUSERSITE": "1",
    }
    version = (python, "-W", "ignore", "-c", "import torch; print(torch.__version__)")
    if block.kind == "gpu":  # the CUDA torch a GPU user has: here its CPU build
        session.run(python, "-m", "pip", "install", "-q", TORCH_SPEC, env=env, external=True)
        before = str(session.run(*version, env=env, external=True, silent=True)).split()[-1]
    script = work / "block.sh"
    script.write_text(block.code)
    with session.chdir(clone):
        if block.kind == "cpu":
            session.run("bash", "-ex", str(script), env=env, external=True)
        else:
            ran = subprocess.run(
                ["bash", "-ex", str(script)],
                env={**os.environ, **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            tail = ran.stdout.strip().splitlines()[-2:]
            session.log(f"exit {ran.returncode}: " + " / ".join(tail))
            refused = ran.returncode == 2 and any(NO_GPU in line for line in tail)
            if ran.returncode != 0 and not refused:
                session.error(f"README.md:{block.line}: the block failed:\n{ran.stdout[-4000:]}")
            after = str(session.run(*version, env=env, external=True, silent=True)).split()[-1]
            if after != before:  # gpucheck keeps the torch it finds
                session.error(f"README.md:{block.line}: torch {before} became {after}")
    if (venv / "bin" / "gpucheck").exists():  # installed: it runs from any folder
        with session.chdir(work):
            session.run(str(venv / "bin" / "gpucheck"), "--version", env=env, external=True)


@nox.session(**VENV)
def lint(session: nox.Session) -> None:
    """Ruff over every Python file of the checkout (its exclude list: pyproject.toml)."""
    session.install("ruff>=0.17,<0.18")
    session.run("python", "-m", "ruff", "check", ".")
    session.run("python", "-m", "ruff", "format", "--check", ".")


@nox.session(**VENV)
def typecheck(session: nox.Session) -> None:
    """Mypy over the package."""
    _install(session, "dev")
    session.run("mypy")


@nox.session(**VENV)
def compile(session: nox.Session) -> None:
    """Compile (not link) every csrc/ source for sm_90 against torch's headers; no GPU needed."""
    _ensure_torch(session)  # the sources are found through the installed package
    session.install("--no-deps", "-e", ".", env={"GPUCHECK_NO_EXTENSION": "1"})
    session.run("python", "-m", "gpucheck._csrc", *session.posargs)


@nox.session(**VENV, default=False)
def package(session: nox.Session) -> None:
    """Build the sdist and wheel, install the wheel outside the checkout, smoke-test it there."""
    _ensure_torch(session)  # the installed wheel's venv shares it
    session.install("build>=1")
    with tempfile.TemporaryDirectory(prefix="gpucheck-package-") as tmp:
        work = Path(tmp)
        # with build isolation (which must not pull torch): the sdist, then the wheel from it
        session.run("python", "-m", "build", "--outdir", str(work / "dist"), ".")
        wheel = next((work / "dist").glob("torch_gpucheck-*.whl"))
        if not wheel.name.endswith("-py3-none-any.whl"):  # the isolated build saw a torch
            session.error(f"expected a wheel without kernels, built {wheel.name}")
        venv = work / "venv"
        session.run("python", "-m", "venv", str(venv))
        python = str(venv / "bin" / "python")
        _, purelib, _ = _probe(session, python)
        _, _, sites = _probe(session)  # torch and the rest of what the session sees
        (purelib / OUTER_PTH).write_text("".join(f"{p}\n" for p in sites))
        # the wheel itself first: a gpucheck of the same version elsewhere on the shared paths
        # (an editable install) must not count as installed
        session.run(
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--force-reinstall",
            str(wheel),
            external=True,
        )
        session.run(python, "-m", "pip", "install", "-q", f"{wheel}[test]", external=True)
        # the CPU tests against the installed wheel, not the checkout: run from elsewhere (no
        # ./suites/ shadowing the bundled ones), with no cwd on sys.path (PYTHONSAFEPATH,
        # inherited by every subprocess), and where gpucheck is imported from checked in the
        # pytest process (found, not imported: pytest's plugin loading imports it)
        check = (
            "import importlib.util, pathlib, sys, pytest; "
            "where = pathlib.Path(importlib.util.find_spec('gpucheck').origin).resolve(); "
            f"assert pathlib.Path({str(ROOT)!r}) not in where.parents, where; "
            "print('gpucheck under test:', where); "
            "sys.exit(pytest.main(['-p', 'no:cacheprovider', *sys.argv[1:]]))"
        )
        with session.chdir(work):  # a smoke set: the tests session ran them all already
            session.run(
                python,
                "-c",
                check,
                *(str(ROOT / t) for t in SMOKE),
                "-n",
                "2",
                *session.posargs,
                external=True,
                env={"PYTHONSAFEPATH": "1"},
            )
        runs = work / "cwd"
        runs.mkdir()
        gpucheck = str(venv / "bin" / "gpucheck")
        with session.chdir(runs):
            # the first run without a GPU: the bundled CPU suites and the distributed suite
            # over gloo, from the installed package; it must test something and pass
            session.run(gpucheck, "run", "--cpu-only", external=True)
            session.run(gpucheck, "selftest", external=True, success_codes=[2])
        empty = [d for d in (runs / "reports").glob("*") if d.is_dir() and not any(d.iterdir())]
        if empty:
            session.error(f"gpucheck selftest left empty run folders: {empty}")


@nox.session(**VENV, default=False)
def gpu(session: nox.Session) -> None:
    """Build the extension and run every suite on every visible GPU (blocking + nvml)."""
    _install(session, "test", build_extension=True)
    session.run("gpucheck", "run", "--all-devices", *session.posargs)


@nox.session(**VENV, default=False)
def sanitize(session: nox.Session) -> None:
    """Run the suites' small cases under compute-sanitizer memcheck on every GPU."""
    _install(session, "test", build_extension=True)
    session.run(
        "gpucheck", "run", "--all-devices", "--mode", "sanitizer:memcheck", *session.posargs
    )
