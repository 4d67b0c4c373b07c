"""Checkpoints a case reads are linted: real PLY and .pt files, written by
the package and by independent writers, read through plyfile and ``torch.load`` inside real
cases of a ``gpucheck run --cpu-only`` (one run for the module), and the detector's records."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from checkpointkit import make_ply, ply_columns, three_dgs_capture, trained_like
from clirun import gpucheck

from gpucheck import checkpoints
from gpucheck.checkpoints.activations import (
    opacity_activation,
    rotation_activation,
    scale_activation,
)
from gpucheck.detectors import CaseInfo, worker_detectors
from gpucheck.model import results

N = 2000
CONFTEST = """
import plyfile
import pytest
import torch

ORIGINAL = (plyfile.PlyData.read, torch.load)


def _readers():
    return (plyfile.PlyData.read, torch.load)


@pytest.fixture(autouse=True)
def readers_are_the_originals_outside_the_body():
    assert _readers() == ORIGINAL and torch.serialization.load is ORIGINAL[1], "before"
    yield
    assert _readers() == ORIGINAL and torch.serialization.load is ORIGINAL[1], "after"


@pytest.fixture
def original_readers():
    return ORIGINAL
"""
SUITE = '''
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from plyfile import PlyData

from gpucheck.reference import rasterize

DATA = Path({data!r})


def load_ply(path):
    """3DGS's GaussianModel.load_ply: PlyData.read, then the columns as arrays."""
    plydata = PlyData.read(path)
    v = plydata.elements[0]
    xyz = np.stack([np.asarray(v[a]) for a in "xyz"], axis=1)
    opacities = np.asarray(v["opacity"])[..., np.newaxis]
    names = sorted((p.name for p in v.properties if p.name.startswith("scale_")),
                   key=lambda x: int(x.split("_")[-1]))
    scales = np.stack([np.asarray(v[n]) for n in names], axis=1)
    rots = np.stack([np.asarray(v[f"rot_{{i}}"]) for i in range(4)], axis=1)
    dc = np.stack([np.asarray(v[f"f_dc_{{i}}"]) for i in range(3)], axis=1)
    return {{k: torch.tensor(x, dtype=torch.float) for k, x in (
        ("xyz", xyz), ("opacity", opacities), ("scaling", scales), ("rotation", rots),
        ("dc", dc))}}


def test_ply_read_and_rendered_the_3dgs_way():
    g = load_ply(str(DATA / "activated.ply"))
    viewmat = torch.eye(4)
    viewmat[2, 3] = 8.0
    out = rasterize(g["xyz"], torch.exp(g["scaling"]),
                    torch.nn.functional.normalize(g["rotation"]),
                    torch.sigmoid(g["opacity"][:, 0]), colors=torch.sigmoid(g["dc"]),
                    viewmat=viewmat, K=torch.tensor([[24.0, 0, 12], [0, 24, 12], [0, 0, 1]]),
                    width=24, height=24)
    assert bool(torch.isfinite(out.image).all())  # the render passes: only the lint can tell


def test_independently_written_ply_read_from_an_open_file():
    with open(DATA / "independent.ply", "rb") as f:
        PlyData.read(f)


def test_pt_dict_loaded():
    torch.load(DATA / "activated.pt")


def test_3dgs_capture_loaded_from_an_open_file():
    with open(DATA / "chkpnt30000.pth", "rb") as f:
        (model_params, first_iter) = torch.load(f)
    assert first_iter == 30000 and len(model_params) == 12


def test_only_the_activated_file_is_named():
    load_ply(str(DATA / "raw.ply"))
    torch.load(DATA / "raw.pt")
    torch.load(DATA / "model.pth")
    torch.load(DATA / "optimizer.pt")
    PlyData.read(str(DATA / "points3D.ply"))
    torch.load(DATA / "activated.pt")


def test_the_same_file_read_three_times():
    load_ply(str(DATA / "activated.ply"))
    PlyData.read(DATA / "activated.ply")
    with open(DATA / "activated.ply", "rb") as f:
        PlyData.read(f)


def test_a_file_with_nan_scales():
    load_ply(str(DATA / "nan.ply"))


def test_reads_the_lint_and_the_round_trip_judge_themselves():
    from gpucheck.checkpoints import RoundtripError, check_roundtrip, read_ply, write_ply
    from gpucheck.checkpoints import activations as act
    from gpucheck.checkpoints.lint import lint

    assert lint(DATA / "linted.ply").verdict == "activated"  # linted on purpose

    def save_activated(p, path):
        write_ply(dataclasses.replace(p, log_scales=act.scale_activation(p.log_scales)), path)

    with pytest.raises(RoundtripError):
        check_roundtrip(save_activated, read_ply)
    load_ply(str(DATA / "activated.ply"))


def test_readers_are_wrapped_during_the_body(original_readers):
    import plyfile

    assert plyfile.PlyData.read is not original_readers[0]
    assert torch.load is not original_readers[1]
'''


def _activated(p: checkpoints.GaussianParams) -> checkpoints.GaussianParams:
    return checkpoints.GaussianParams(
        p.means,
        p.features_dc,
        p.features_rest,
        scale_activation(p.log_scales),
        opacity_activation(p.opacity_logits),
        rotation_activation(p.rotations_raw),
        p.sh_degree,
    )


def _write_data(data: Path) -> None:
    """Real files: the package's writers, the independent PLY writer of test_checkpoints.py,
    3DGS's capture tuple saved with torch.save, a model's and an optimizer's state dicts and a
    COLMAP-style point cloud PLY."""
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    print(f"seed {gen.initial_seed()}")
    raw = trained_like(N, 1, gen)
    act = _activated(raw)
    checkpoints.save(raw, data / "raw.ply")
    checkpoints.save(raw, data / "raw.pt")
    checkpoints.save(act, data / "activated.ply")
    checkpoints.save(act, data / "linted.ply")
    checkpoints.save(act, data / "activated.pt")
    (data / "independent.ply").write_bytes(make_ply(ply_columns(act), "binary_big_endian"))
    capture = list(three_dgs_capture(act, gen))  # with a real Adam state after one step
    capture[1:7] = [
        torch.nn.Parameter(t)
        for t in (  # the values as saved, before the step
            act.means,
            act.features_dc,
            act.features_rest,
            act.log_scales,
            act.rotations_raw,
            act.opacity_logits[:, None],
        )
    ]
    torch.save((tuple(capture), 30000), data / "chkpnt30000.pth")
    cols = ply_columns(raw)
    cols["scale_1"] = cols["scale_1"].copy()
    cols["scale_1"][::7] = np.nan
    (data / "nan.ply").write_bytes(make_ply(cols))
    model = torch.nn.Linear(4, 4)
    torch.save(model.state_dict(), data / "model.pth")
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(4)).sum().backward()
    opt.step()
    torch.save(opt.state_dict(), data / "optimizer.pt")
    xyz = {a: torch.randn(N, generator=gen).numpy() for a in ("x", "y", "z", "nx", "ny", "nz")}
    rgb = {c: np.arange(N, dtype=np.uint8) for c in ("red", "green", "blue")}
    (data / "points3D.ply").write_bytes(make_ply({**xyz, **rgb}, types=dict.fromkeys(rgb, "uchar")))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The data folder and the case records (by test name) of one ``gpucheck run``."""
    root = tmp_path_factory.mktemp("reads")
    data = root / "data"
    data.mkdir()
    _write_data(data)
    suite = root / "reads"
    suite.mkdir()
    (suite / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (suite / "test_reads.py").write_text(SUITE.format(data=str(data)))
    out = root / "out"
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--quiet",
        "--suite",
        str(suite),
        "--out",
        str(out),
        cwd=root,
        timeout=300,
        env={"GPUCHECK_DISABLE_DETECTORS": None},
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in said, said  # findings of severity error
    recs = {r["case"].split("::")[-1]: r for r in results.cases(out / "results.jsonl")}
    assert len(recs) == SUITE.count("\ndef test_"), said
    return data, recs


def _findings(
    recs: dict[str, dict[str, Any]], case: str, kind: str | None = None
) -> list[dict[str, Any]]:
    rec = recs[case]
    assert rec["status"] == "passed", rec  # a passing case: only the detector tells
    return [f for f in rec["findings"] if kind is None or f["kind"] == kind]


@pytest.mark.parametrize(
    ("case", "name", "via"),
    [
        ("test_ply_read_and_rendered_the_3dgs_way", "activated.ply", "plyfile.PlyData.read"),
        (
            "test_independently_written_ply_read_from_an_open_file",
            "independent.ply",
            "plyfile.PlyData.read",
        ),
        ("test_pt_dict_loaded", "activated.pt", "torch.load"),
        ("test_3dgs_capture_loaded_from_an_open_file", "chkpnt30000.pth", "torch.load"),
    ],
)
def test_an_activated_checkpoint_a_case_reads_is_named(run, case: str, name: str, via: str) -> None:
    data, recs = run
    [f] = _findings(recs, case)
    assert (f["kind"], f["severity"], f["device"]) == ("double-activation", "error", "cpu")
    assert f["message"].startswith(f"{data / name}: ")
    assert "scales and opacities are stored activated" in f["message"]
    assert f["evidence"].startswith(f"read with {via} at test_reads.py:")
    assert "scales     activated" in f["evidence"] and "opacities  activated" in f["evidence"]
    assert "log(scales)" in f["hint"] and "logit(opacities)" in f["hint"]


def test_raw_files_state_dicts_and_point_clouds_are_not_named(run) -> None:
    data, recs = run
    [f] = _findings(recs, "test_only_the_activated_file_is_named")
    assert f["kind"] == "double-activation" and f["message"].startswith(
        f"{data / 'activated.pt'}: "
    )


def test_a_file_read_three_times_in_a_case_is_named_once(run) -> None:
    data, recs = run
    [f] = _findings(recs, "test_the_same_file_read_three_times")
    assert f["message"].startswith(f"{data / 'activated.ply'}: ")


def test_a_suspicious_checkpoint_is_a_warning(run) -> None:
    data, recs = run
    [f] = _findings(recs, "test_a_file_with_nan_scales")
    assert (f["kind"], f["severity"]) == ("checkpoint-suspicious", "warning")
    assert f["message"].startswith(f"{data / 'nan.ply'}: ") and "scales" in f["message"]
    assert "NaN/inf" in f["evidence"]


def test_reads_inside_the_lint_and_check_roundtrip_are_left_to_them(run) -> None:
    data, recs = run
    found = _findings(recs, "test_reads_the_lint_and_the_round_trip_judge_themselves")
    said = [f["message"] for f in found]
    assert [f["kind"] for f in found] == ["double-activation"] * 2, said
    assert sum(m.startswith("activation applied twice") for m in said) == 1, said  # roundtrip
    assert sum(m.startswith(f"{data / 'activated.ply'}: ") for m in said) == 1, said
    assert not [m for m in said if "linted.ply" in m or "gpucheck-roundtrip" in m]


def test_the_readers_are_wrapped_only_during_the_body(run) -> None:
    _, recs = run
    # the suite's autouse fixture checks the originals before and after every case
    assert all(r["status"] == "passed" for r in recs.values()), recs
    assert _findings(recs, "test_readers_are_wrapped_during_the_body") == []


CASE = CaseInfo("cpu", "reads", "test_x.py::test_x")


def test_a_module_a_case_imports_during_its_body_is_watched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import plyfile

    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    path = tmp_path / "point_cloud.ply"
    checkpoints.save(_activated(trained_like(300, 0, gen)), path)
    monkeypatch.delitem(sys.modules, "plyfile")  # not imported when the case starts
    [d] = [d for d in worker_detectors() if d.name == "checkpoint-reads"]
    d.case_started(CASE)
    import plyfile as imported  # the case's own import

    assert imported is not plyfile
    imported.PlyData.read(str(path))
    [f] = d.case_finished(CASE)
    assert f.kind == "double-activation" and f.message.startswith(f"{path}: ")
    assert imported.PlyData.read.__code__.co_filename == imported.__file__  # restored
    assert not [m for m in sys.meta_path if type(m).__name__ == "_ImportWatch"]  # gone


def test_the_detector_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "checkpoint-reads" in [d.name for d in worker_detectors()]
    monkeypatch.setenv("GPUCHECK_DISABLE_DETECTORS", "checkpoint-reads")
    names = [d.name for d in worker_detectors()]
    assert "checkpoint-reads" not in names and "double-activation" in names
