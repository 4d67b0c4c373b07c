"""The CLI's contract: exit codes 0/1/2 and one clear sentence for bad input, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from clirun import gpucheck
from conftest import two_gpu_inventory as _two_gpus

from gpucheck import cli, devices
from gpucheck.devices import Inventory


def _no_traceback(proc):
    assert "Traceback" not in proc.stderr + proc.stdout


def test_devices_without_gpu_is_a_sentence_and_exit_2():
    proc = gpucheck("devices")
    _no_traceback(proc)
    if "visible CUDA device" in proc.stdout:
        pytest.skip("this machine has GPUs")
    assert proc.returncode == 2  # no usable GPU: a job that needs one can gate on it
    assert proc.stdout.startswith("No NVIDIA GPU")


def test_devices_json_without_gpu_lists_no_devices():
    proc = gpucheck("devices", "--json")
    data = json.loads(proc.stdout)
    if data["devices"]:
        pytest.skip("this machine has GPUs")
    assert proc.returncode == 2
    assert data["devices"] == []
    assert data["reason"]
    assert data["torch_version"]


def test_devices_with_no_device_visible_exits_2(monkeypatch, capsys):
    none = Inventory(
        [],
        "No CUDA device is visible (CUDA_VISIBLE_DEVICES is empty).",
        "580",
        "13.0",
        None,
        "2.11",
        None,
        "none",
    )
    monkeypatch.setattr(devices, "discover", lambda: none)
    assert cli.main(["devices"]) == 2
    assert "No CUDA device is visible" in capsys.readouterr().out


def test_python_dash_m_gpucheck_is_the_command():
    proc = subprocess.run(
        [sys.executable, "-m", "gpucheck", "--version"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"gpucheck, version {gpucheck_version()}"
    proc = subprocess.run(
        [sys.executable, "-m", "gpucheck", "report", "/no/such/run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def gpucheck_version() -> str:
    import gpucheck as package

    return package.__version__


def test_run_without_gpu_says_so_in_one_line_and_exits_2(tmp_path):
    proc = gpucheck("run", "--out", str(tmp_path / "r"))
    if proc.returncode == 0:
        pytest.skip("this machine has GPUs")
    _no_traceback(proc)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "No NVIDIA GPU" in lines[0] and "--cpu-only" in lines[0]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["run", "--device", "5"], "--device 5 is out of range: 2 CUDA device(s) visible (0, 1)"),
        (["run", "--device", "0", "--all-devices"], "exclude each other"),
        (["run", "--mode", "sanitizer:memcheck"], "compute-sanitizer was not found"),
        (["run", "--cpu-only", "--mode", "sanitizer"], "the sanitizer modes need a GPU"),
        (["run", "--suite", "no-such-suite"], "unknown suite 'no-such-suite'"),
    ],
)
def test_bad_run_requests_exit_2(monkeypatch, capsys, tmp_path, args, words):
    monkeypatch.setattr(devices, "discover", _two_gpus)
    monkeypatch.chdir(tmp_path)
    code = cli.main([*args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert words in err


def test_unusable_out_folder_exits_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(devices, "discover", _two_gpus)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code = cli.main(["run", "--out", str(blocker / "sub")])
    assert code == 2
    assert "cannot write to the output folder" in capsys.readouterr().err


def test_usage_errors_exit_2():
    for args in (
        ["run", "--device", "x"],
        ["run", "--device", "-1"],
        ["run", "--timeout", "0"],
        ["run", "--mode", "bogus"],
        ["nonsense"],
    ):
        proc = gpucheck(*args)
        _no_traceback(proc)
        assert proc.returncode == 2, args


def test_driver_mismatch_exits_2(monkeypatch, capsys):
    broken = Inventory(
        [],
        "No CUDA device is usable: driver/library version mismatch.",
        None,
        None,
        None,
        None,
        None,
        "none",
        environment_error="No CUDA device is usable: version mismatch.",
    )
    monkeypatch.setattr(devices, "discover", lambda: broken)
    assert cli.main(["devices"]) == 2
    assert cli.main(["run"]) == 2
    assert "version mismatch" in capsys.readouterr().err


def test_devices_table_with_gpus(monkeypatch, capsys):
    monkeypatch.setattr(devices, "discover", _two_gpus)
    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "2 visible CUDA device(s)" in out and "GPU-1" in out and "peer access" in out


def test_targets_carry_uuid_name_and_driver(monkeypatch):
    from gpucheck.controller.config import RunConfig, choose_targets

    monkeypatch.setattr(devices, "discover", _two_gpus)
    targets, notes, driver, inv = choose_targets(RunConfig(devices=(1,)))
    assert targets == [("cuda:1", 1, "GPU-1", "NVIDIA H200")]
    assert driver == "580" and notes == [] and len(inv.devices) == 2


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["run", "--cpu-only", "--device", "99"],
            "--device picks GPUs, and --cpu-only runs without any: drop one of them",
        ),
        (["run", "--cpu-only", "--all-devices"], "--all-devices picks GPUs"),
        (["run", "--cpu-only", "--mode", "nvml"], "drop --mode nvml"),
        (
            ["run", "--cpu-only", "--nvml-interval", "10"],
            "--nvml-interval sets the sampling of mode nvml, and --cpu-only has no GPU to sample",
        ),
        (
            ["run", "--mode", "blocking", "--nvml-interval", "10"],
            "mode nvml is not among the --mode given: drop --nvml-interval",
        ),
        (
            ["run", "--distributed", "--cpu-only", "--mode", "blocking"],
            "--distributed runs its ranks in its own mode (dist): drop --mode",
        ),
        (["run", "--distributed", "--nvml-interval", "20"], "--distributed does not sample NVML"),
    ],
)
def test_an_option_that_cannot_apply_is_refused(tmp_path, args, words):
    """`--device 99` under --cpu-only was silently ignored; so were --nvml-interval without
    mode nvml and --mode under --distributed. Each is one sentence and exit 2, before any
    folder is made or any device is looked at."""
    proc = gpucheck(*args, "--out", str(tmp_path / "out"), cwd=tmp_path)
    _no_traceback(proc)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_resume_refuses_a_timeout_it_would_ignore(tmp_path, capsys):
    folder = tmp_path / "old"
    folder.mkdir()
    assert cli.main(["run", "--resume", str(folder), "--timeout", "5"]) == 2
    assert "drop --timeout" in capsys.readouterr().err


def test_report_refuses_an_html_path_without_html(tmp_path, capsys):
    (tmp_path / "results.jsonl").write_text("")
    assert (
        cli.main(["report", str(tmp_path), "-o", str(tmp_path / "p.html"), "--format", "sarif"])
        == 2
    )
    assert "drop -o or add --format html" in capsys.readouterr().err
    assert not (tmp_path / "results.sarif").exists()


def test_selftest_without_gpu_is_one_sentence_before_any_build(monkeypatch, capsys, tmp_path):
    """It built for 16 s, then suggested --cpu-only (which it does not have) and left an
    empty reports/<timestamp>/."""
    from gpucheck import selftest

    nothing = Inventory(
        [],
        "No NVIDIA GPU is usable: the NVIDIA driver's NVML library "
        "(libnvidia-ml.so.1) was not found.",
        None,
        None,
        None,
        "2.13",
        None,
        "none",
    )
    monkeypatch.setattr(devices, "discover", lambda: nothing)
    monkeypatch.setattr(selftest, "prebuild", lambda *a: pytest.fail("built without a GPU"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["selftest"]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert line == (
        "gpucheck: gpucheck selftest needs a CUDA GPU, and no NVIDIA GPU is usable: "
        "the NVIDIA driver's NVML library (libnvidia-ml.so.1) was not found; "
        "`gpucheck run --cpu-only` is what runs without one"
    )
    assert "building" not in captured.out
    assert list(tmp_path.iterdir()) == []  # no reports/<timestamp>/


PROJECT = """[project]
name = "my-ext"

[tool.gpucheck]
suites = ["mine"]
timeout = 42
formats = ["json"]
modes = ["blocking"]
"""


def _project(tmp_path, extra: str = ""):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "test_ok.py").write_text("def test_ok():\n    assert 1 + 1 == 2\n")
    (tmp_path / "pyproject.toml").write_text(PROJECT + extra)


def _config(out):
    head = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    return head["config"]


def test_pyproject_tool_gpucheck_sets_the_runs_defaults(tmp_path):
    _project(tmp_path)
    proc = gpucheck("run", "--cpu-only", "--out", "a", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = _config(tmp_path / "a")
    assert config["suites"] == ["mine"] and config["timeout"] == 42.0
    assert sorted(p.name for p in (tmp_path / "a").iterdir() if p.is_file()) == [
        "results.json",
        "results.jsonl",
    ]  # formats = ["json"]


def test_options_given_override_pyproject_settings(tmp_path):
    _project(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "test_two.py").write_text("def test_two():\n    pass\n")
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--out",
        "b",
        "--quiet",
        "--suite",
        "other",
        "--timeout",
        "7",
        "--format",
        "html",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = _config(tmp_path / "b")
    assert config["suites"] == ["other"] and config["timeout"] == 7.0
    assert (tmp_path / "b" / "report.html").exists()
    assert not (tmp_path / "b" / "results.json").exists()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("bogus = 1\n", "has unknown setting(s) bogus; known: suites, modes, timeout, formats"),
        ('timeout = "soon"\n', "timeout must be a number of seconds above 0, got 'soon'"),
        ('formats = ["pdf"]\n', "formats 'pdf' is not one of html, json, junit, sarif"),
    ],
)
def test_a_bad_pyproject_setting_is_one_sentence_and_exit_2(tmp_path, extra, words):
    _project(tmp_path)
    text = (tmp_path / "pyproject.toml").read_text()
    key = extra.split(" ")[0]
    kept = "".join(line + "\n" for line in text.splitlines() if not line.startswith(key))
    (tmp_path / "pyproject.toml").write_text(kept + extra)
    proc = gpucheck("run", "--cpu-only", "--out", "c", cwd=tmp_path)
    _no_traceback(proc)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpucheck: [tool.gpucheck] of {tmp_path / 'pyproject.toml'} {words}".replace(
            "toml timeout", "toml: timeout"
        ).replace("toml formats", "toml: formats")
    ]
    assert not (tmp_path / "c").exists()


def test_report_into_a_read_only_folder_names_the_path(tmp_path):
    """As root, the command runs without CAP_DAC_OVERRIDE so that the folder's mode holds."""
    from faultkit import drop_capabilities
    from report_synth import make_run

    run = make_run(tmp_path / "run", devices=1, cases=4)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        proc = gpucheck(
            "report",
            str(run),
            "-o",
            str(locked / "page.html"),
            preexec_fn=(lambda: drop_capabilities(1, 2)) if os.geteuid() == 0 else None,
        )
    finally:
        locked.chmod(0o755)
    _no_traceback(proc)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpucheck: cannot write the report {locked / 'page.html'}: Permission denied"
    ]
    assert not list(locked.iterdir())


def test_report_where_a_file_stands_in_the_way_names_both(tmp_path):
    from report_synth import make_run

    run = make_run(tmp_path / "run", devices=1, cases=4)
    (tmp_path / "file").write_text("")
    proc = gpucheck("report", str(run), "-o", str(tmp_path / "file" / "page.html"))
    _no_traceback(proc)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpucheck: cannot write the report {tmp_path / 'file' / 'page.html'}: "
        f"{tmp_path / 'file'}: File exists"
    ]
