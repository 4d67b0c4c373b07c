"""Building gpucheck's kernels where they were not built at install: the architectures and
the CUDA toolkit a build uses, the one sentence of each way it cannot happen (this machine's
CPU-only torch, no nvcc, no ninja, a compile that fails), a cached build that needs neither nvcc
nor ninja, and the first-use build shared by processes that start at once (one builds, with
one progress line; the others wait and load it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest
import torch

from gpucheck._csrc import extension, toolchain
from gpucheck.errors import ExtensionNotBuilt

#: `nvcc --list-gpu-arch` of CUDA 13.0 (as recorded) and of CUDA 11.8
NVCC_13_0 = (
    "compute_75\ncompute_80\ncompute_86\ncompute_87\ncompute_88\ncompute_89\n"
    "compute_90\ncompute_100\ncompute_110\ncompute_103\ncompute_120\ncompute_121\n"
)
NVCC_11_8 = (
    "compute_35\ncompute_37\ncompute_50\ncompute_52\ncompute_53\ncompute_60\n"
    "compute_61\ncompute_62\ncompute_70\ncompute_72\ncompute_75\ncompute_80\n"
    "compute_86\ncompute_87\ncompute_89\ncompute_90\n"
)


# --- which architectures ----------------------------------------------------------------------


def test_nvcc_arch_lists_are_read():
    assert toolchain.parse_gpu_archs(NVCC_13_0) == [
        "7.5",
        "8.0",
        "8.6",
        "8.7",
        "8.8",
        "8.9",
        "9.0",
        "10.0",
        "10.3",
        "11.0",
        "12.0",
        "12.1",
    ]
    assert toolchain.parse_gpu_archs("nvcc fatal   : Unknown option '--list-gpu-arch'\n") == []


def test_without_gpu_the_current_generations_plus_ptx_that_nvcc_supports():
    assert toolchain.arch_list([], toolchain.parse_gpu_archs(NVCC_13_0)) == [
        "8.0",
        "8.6",
        "8.9",
        "9.0",
        "10.0",
        "12.0+PTX",
    ]
    assert toolchain.arch_list([], toolchain.parse_gpu_archs(NVCC_11_8)) == [
        "8.0",
        "8.6",
        "8.9",
        "9.0+PTX",
    ]
    assert toolchain.arch_list([], None) == [*toolchain.DEFAULT_ARCHS[:-1], "12.0+PTX"]


def test_with_gpus_their_architectures_and_ptx_for_one_newer_than_nvcc():
    assert toolchain.arch_list([(9, 0), (9, 0)], toolchain.parse_gpu_archs(NVCC_13_0)) == ["9.0"]
    assert toolchain.arch_list([(8, 6), (9, 0)], None) == ["8.6", "9.0"]
    assert toolchain.arch_list([(12, 0), (8, 0)], toolchain.parse_gpu_archs(NVCC_11_8)) == [
        "8.0",
        "9.0+PTX",
    ]


def test_arch_flags_labels_and_the_env_list():
    assert toolchain.gencode_flags(["9.0", "12.0+PTX"]) == [
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_120,code=sm_120",
        "-gencode=arch=compute_120,code=compute_120",
    ]
    assert toolchain.arch_label(["9.0"]) == "sm_90"
    assert toolchain.arch_label(["8.0", "12.0+PTX"]) == "sm_80, sm_120 (+PTX)"
    assert toolchain.parse_arch_env("8.0;9.0+PTX") == ["8.0", "9.0+PTX"]
    assert toolchain.parse_arch_env(" 8.6 9.0 ") == ["8.6", "9.0"]
    assert toolchain.parse_arch_env("Hopper") is None  # torch's names: torch reads them


# --- which CUDA toolkit -----------------------------------------------------------------------


def _toolkit(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (root / "include" / "cuda_runtime_api.h").write_text("")
    return root


def test_cuda_home_from_the_environment_first(tmp_path):
    home = _toolkit(tmp_path / "cuda-12.8")
    other = _toolkit(tmp_path / "cuda-13.0")
    assert (
        toolchain.find_cuda_home(
            {"CUDA_HOME": str(home)}, str(other / "bin" / "nvcc"), default=other
        )
        == home
    )
    assert toolchain.find_cuda_home({"CUDA_PATH": str(home)}, None, default=other) == home
    assert (
        toolchain.find_cuda_home({"CUDA_HOME": str(tmp_path / "nothing")}, None, default=other)
        == other
    )


def test_cuda_home_through_a_symlinked_or_wrapped_nvcc_on_path(tmp_path):
    real = _toolkit(tmp_path / "cuda-13.0")
    links = tmp_path / "links" / "bin"
    links.mkdir(parents=True)
    (links / "nvcc").symlink_to(real / "bin" / "nvcc")
    none = tmp_path / "none"
    assert toolchain.find_cuda_home({}, str(links / "nvcc"), default=none) == real
    # /usr/local/bin/nvcc as a script that runs the real one: torch would take /usr/local
    wrapper = tmp_path / "usr" / "local" / "bin" / "nvcc"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f"#!/bin/sh\necho '#$ _HERE_={real / 'bin'}' >&2\n")
    wrapper.chmod(0o755)
    assert toolchain.find_cuda_home({}, str(wrapper), default=none) == real  # nvcc asked
    assert toolchain.find_cuda_home({}, str(wrapper), ask_nvcc=lambda _: None, default=none) is None
    assert toolchain.find_cuda_home({}, None, default=none) is None


def test_the_cache_honours_its_variable_then_xdg(tmp_path):
    assert (
        toolchain.cache_dir({"GPUCHECK_CACHE_DIR": str(tmp_path / "c"), "XDG_CACHE_HOME": "/x"})
        == tmp_path / "c"
    )
    assert toolchain.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "gpucheck"
    assert toolchain.cache_dir({}) == Path.home() / ".cache" / "gpucheck"


# --- the sentence of each way the kernels cannot be had -------------------------------------


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """extension.load() tried anew (it remembers its outcome per process), building into a
    private cache."""
    monkeypatch.setenv(toolchain.CACHE_ENV, str(tmp_path / "cache"))
    extension._attempt.cache_clear()
    yield tmp_path / "cache"
    extension._attempt.cache_clear()


def _sentence() -> str:
    with pytest.raises(ExtensionNotBuilt) as err:
        extension.load()
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        "gpucheck's CUDA extension is not available: "
    )
    return message


def test_a_cpu_only_torch_is_one_sentence(fresh):
    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    message = _sentence()
    assert f"torch {torch.__version__} is a CPU-only build" in message
    assert "docs/install.md" in message
    assert not fresh.exists()  # nothing was built
    assert extension.problem_in_child() == message  # the same, from the harness's child check


def test_no_nvcc_anywhere_is_one_sentence(fresh, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.version, "cuda", "13.0")  # past the CPU-only check
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(toolchain, "DEFAULT_CUDA_HOME", tmp_path / "no-cuda")
    message = _sentence()
    assert "no CUDA toolkit was found" in message and "set CUDA_HOME" in message
    assert not fresh.exists()


def test_a_build_without_ninja_is_one_sentence(fresh, monkeypatch, tmp_path):
    """ninja missing (for real: a PATH without it) when a build is needed;
    the toolkit is a folder with an nvcc that is never run. The stand-in, as above: this
    CPU-only torch taken for a CUDA build."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("CUDA_HOME", str(_toolkit(tmp_path / "cuda")))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    message = _sentence()
    assert "they are built on first use with ninja, which is not on PATH" in message
    assert "pip install ninja" in message
    assert not fresh.exists()  # not even a build folder


def test_a_failing_compile_is_one_sentence_with_its_log(fresh, monkeypatch, capfd):
    """This machine's CPU-only torch, taken for a CUDA build, compiles for real and fails:
    its headers lack the config CUDA builds generate."""
    if toolchain.cuda_home() is None:
        pytest.skip("needs nvcc")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("GPUCHECK_KERNELS", "knn")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setenv("MAX_JOBS", "1")  # stop at the first failure
    message = _sentence()
    log = Path(message.rsplit("the compiler's output is in ", 1)[1])
    assert "building it for sm_90 with " in message and "error" in message
    assert log.is_file() and fresh in log.parents and "FAILED" in log.read_text()
    said = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert said == [
        f"gpucheck: building the CUDA kernels for sm_90 (first use; about a minute) in {log.parent}"
    ]
    assert _sentence() == message  # remembered: not built again by the next call


# --- one build for processes that start at once --------------------------------------------------


def _fake_library(where: Path) -> Path:
    """A real extension module named _C (what a build of the kernels is, minus the ops)."""
    src = where / "c.c"
    src.write_text(
        textwrap.dedent("""\
        #include <Python.h>
        static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, NULL};
        PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&def); }
        """)
    )
    lib = where / "_C.so"
    cc = os.environ.get("CC", "cc")
    proc = subprocess.run(
        [cc, "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(lib)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"no C compiler for Python extensions here: {proc.stderr[-300:]}")
    return lib


LOADER = """\
import shutil, sys, time
from pathlib import Path
import torch
torch.version.cuda = "13.0"  # taken for a CUDA build: its build is replaced below
from gpucheck._csrc import toolchain
from gpucheck._csrc import extension
toolchain.cuda_home = lambda: Path("/opt/cuda")
extension._build_tools = lambda torch, home: Path("/opt/cuda")  # nvcc and ninja: not used below

def build(sources, archs, folder, cuda_home, label):  # stands in for the compile
    with open(sys.argv[2], "a") as f:
        f.write("built\\n")
    time.sleep(2)
    shutil.copy(sys.argv[1], folder / "_C.so")

extension._build = build
print(extension.load().__name__)
"""


def test_an_op_the_build_does_not_hold_is_one_sentence(monkeypatch):
    """A build made with GPUCHECK_KERNELS naming other kernels holds no schema of the op a
    wrapper asks for (each kernel declares its own): one sentence, not torch's AttributeError
    or a missing CUDA kernel at the first call."""
    monkeypatch.setattr(extension, "load", lambda: None)  # the build loaded: here, none at all

    def asked() -> str:
        with pytest.raises(ExtensionNotBuilt) as err:
            extension.registered_op("gpucheck::knn_mean_sq_dist", lambda points, k=3: points)
        return str(err.value)

    monkeypatch.setenv("GPUCHECK_KERNELS", "ssim")
    assert asked() == (
        "gpucheck's CUDA extension is not available: its build holds no op "
        "gpucheck::knn_mean_sq_dist: GPUCHECK_KERNELS=ssim leaves its kernel out"
    )
    monkeypatch.delenv("GPUCHECK_KERNELS")
    said = asked()
    assert "its build holds no op gpucheck::knn_mean_sq_dist" in said and "\n" not in said
    assert said.endswith(extension.BUILD_HINT)


def test_processes_starting_at_once_build_once_and_all_load(tmp_path, monkeypatch):
    library = _fake_library(tmp_path)
    monkeypatch.setenv(toolchain.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    (tmp_path / "loader.py").write_text(LOADER)
    builds = tmp_path / "builds.txt"

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(tmp_path / "loader.py"), str(library), str(builds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    procs = [start() for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert [out.strip() for out, _ in outs] == ["gpucheck._C"] * 3
    progress = [
        line
        for _, err in outs
        for line in err.splitlines()
        if line.startswith("gpucheck: building the CUDA kernels for sm_90 ")
    ]
    assert len(progress) == 1 and builds.read_text() == "built\n"
    later = start()  # a later process loads the cached build: no build, no line
    out, err = later.communicate(timeout=300)
    assert (later.returncode, out.strip(), err.strip()) == (0, "gpucheck._C", "")
    assert builds.read_text() == "built\n"


LOAD_ONLY = """\
import torch
torch.version.cuda = "13.0"
from gpucheck._csrc import toolchain
from gpucheck._csrc import extension
toolchain.cuda_home = lambda: None  # no toolkit: this machine's /usr/local/cuda cannot be hidden
def build(*args):
    raise AssertionError("a build was started")
extension._build = build
print(extension.load().__name__)
"""


def test_a_cached_build_loads_without_nvcc_or_ninja(tmp_path, monkeypatch):
    """nvcc and ninja are needed to build the kernels, never to load a
    build made before (a runtime image without the toolkit, a shared cache). The later
    process has neither: ninja missing for real (PATH), the toolkit through the stand-in."""
    library = _fake_library(tmp_path)
    monkeypatch.setenv(toolchain.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    (tmp_path / "loader.py").write_text(LOADER)
    builds = tmp_path / "builds.txt"
    first = subprocess.run(
        [sys.executable, str(tmp_path / "loader.py"), str(library), str(builds)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 0 and builds.read_text() == "built\n", first.stderr
    (tmp_path / "empty").mkdir()
    later = subprocess.run(
        [sys.executable, "-c", LOAD_ONLY],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": str(tmp_path / "empty")},
    )
    assert (later.returncode, later.stdout.strip(), later.stderr.strip()) == (
        0,
        "gpucheck._C",
        "",
    ), later.stderr


def test_a_killed_build_leaves_no_lock_behind(tmp_path):
    lock = tmp_path / "gpucheck.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""\
        import time
        from pathlib import Path
        from gpucheck._csrc import extension
        with extension._locked(Path({str(lock)!r}), exclusive=True):
            print("held", flush=True)
            time.sleep(600)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    start = time.monotonic()
    with extension._locked(lock, exclusive=True):
        assert time.monotonic() - start < 5


def test_a_load_check_that_passed_is_remembered_until_something_changes(fresh, monkeypatch):
    """The harness's child check costs a torch import and a load before any worker: once it
    loaded the kernels, the next run skips it while Python, torch, the sources and the
    module file stay the same; a failed check is never remembered."""
    import subprocess

    module = fresh.parent / "_C.so"
    module.write_bytes(b"\x7fELF")
    children = []
    answer = {"code": 0, "out": f"{extension.LOADED}{module}\n"}

    def child(cmd, **kwargs):
        children.append(cmd)
        return subprocess.CompletedProcess(cmd, answer["code"], answer["out"], None)

    monkeypatch.setattr(extension.subprocess, "run", child)
    assert extension.problem_in_child() is None
    assert extension.problem_in_child() is None
    assert len(children) == 1  # the second run read the first one's answer
    module.write_bytes(b"\x7fELF rebuilt")  # another module file: checked again
    assert extension.problem_in_child() is None
    assert len(children) == 2
    monkeypatch.setenv("GPUCHECK_KERNELS", "ssim")  # other kernels asked for: checked again
    answer.update(code=3, out="gpucheck's CUDA extension is not available: no nvcc\n")
    assert extension.problem_in_child() == "gpucheck's CUDA extension is not available: no nvcc"
    assert extension.problem_in_child() is not None
    assert len(children) == 4  # a failure is asked again every time


def test_the_load_check_imports_no_torch_in_the_harness():
    """The controller asks ``gpucheck._csrc.extension`` whether the kernels load: reading that
    module must not import torch (seconds before any worker starts), while the wrappers
    are still there on first use."""
    import subprocess
    import sys

    code = (
        "import sys; from gpucheck._csrc import extension; assert 'torch' not in sys.modules, 1; "
        "import gpucheck.ops as ops; assert 'torch' not in sys.modules, 2; "
        "ops.ssim; assert 'torch' in sys.modules, 3"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
