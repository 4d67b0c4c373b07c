"""`gpucheck lint-checkpoint` and `check_roundtrip` on checkpoints written by the package and by
an independent writer (the test's own PLY bytes and torch.save calls): raw and activated, other
SH degrees, extra fields, big-endian and ASCII, both .pt forms, truncated and broken files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpointkit import make_ply, ply_columns, trained_like
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucheck import cli
from gpucheck.checkpoints import (
    GaussianParams,
    RoundtripError,
    check_roundtrip,
    read_ply,
    write_ply,
    write_pt,
)
from gpucheck.checkpoints.activations import (
    opacity_activation,
    rotation_activation,
    scale_activation,
)
from gpucheck.checkpoints.lint import lint


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def activated(p: GaussianParams) -> GaussianParams:
    """What a buggy writer stores: the values the renderer takes, in the raw fields."""
    return GaussianParams(
        p.means,
        p.features_dc,
        p.features_rest,
        scale_activation(p.log_scales),
        opacity_activation(p.opacity_logits),
        rotation_activation(p.rotations_raw),
        p.sh_degree,
    )


def scene(gen: torch.Generator, n: int = 2000, degree: int = 3) -> GaussianParams:
    p = trained_like(n, degree, gen)
    p.means = p.means * 4
    return p


def verdicts(path: Path, **kw) -> dict[str, str]:
    r = lint(path, **kw)
    return {"file": r.verdict, **{p.name: p.verdict for p in r.params}}


# --- written by the package ---------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".ply", ".pt"])
def test_package_raw_is_ok_and_activated_is_named(tmp_path, gen, suffix):
    p = scene(gen)
    raw, act = tmp_path / f"raw{suffix}", tmp_path / f"act{suffix}"
    save = write_ply if suffix == ".ply" else write_pt
    save(p, raw)
    save(activated(p), act)
    assert verdicts(raw) == {
        "file": "ok",
        "scales": "ok",
        "opacities": "ok",
        "rotations": "ok",
        "means": "ok",
        "features": "ok",
    }
    got = verdicts(act)
    assert got["file"] == "activated"
    assert got["scales"] == got["opacities"] == got["rotations"] == "activated"
    r = lint(act)
    assert r.exit_code == 1 and "log(scales)" in (r.fix or "")
    assert r.params[0].evidence["share_positive"] == 1.0
    assert lint(raw).exit_code == 0


def test_capture_form_written_by_the_package(tmp_path, gen):
    p = scene(gen, degree=1)
    write_pt(activated(p), tmp_path / "chkpnt30000.pth", form="capture", iteration=30000)
    r = lint(tmp_path / "chkpnt30000.pth")
    assert r.verdict == "activated" and "iteration 30000" in (r.layout or "")
    assert r.sh_degree == 1 and r.n == 2000


# --- written independently -----------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["binary_little_endian", "binary_big_endian", "ascii"])
@pytest.mark.parametrize("degree", [0, 2])
def test_independent_ply_with_extra_fields(tmp_path, gen, fmt, degree):
    n = 300 if fmt == "ascii" else 1500
    p = scene(gen, n, degree)
    for name, params in (("raw", p), ("act", activated(p))):
        cols = {
            "confidence": np.ones(n, np.float32),
            **ply_columns(params),
            "red": np.full(n, 200, np.uint8),
        }
        path = tmp_path / f"{name}.ply"
        path.write_bytes(
            make_ply(
                cols, fmt, types={"red": "uchar"}, extra="element camera 0\nproperty float fx\n"
            )
        )
        r = lint(path)
        assert r.verdict == ("ok" if name == "raw" else "activated"), r
        assert r.sh_degree == degree and r.n == n
        assert fmt.split("_")[-2 if fmt != "ascii" else 0] in (r.layout or "")


def test_independent_pt_with_extra_keys_and_3dgs_names(tmp_path, gen):
    p = activated(scene(gen, 800, 1))
    torch.save(
        {
            "_xyz": p.means,
            "_features_dc": p.features_dc,
            "_features_rest": p.features_rest,
            "_scaling": p.log_scales,
            "_opacity": p.opacity_logits[:, None],
            "_rotation": p.rotations_raw,
            "active_sh_degree": 1,
            "optimizer": {"lr": 1e-3},
            "note": "exported",
        },
        tmp_path / "theirs.pt",
    )
    assert verdicts(tmp_path / "theirs.pt")["file"] == "activated"


def test_independent_capture_tuple(tmp_path, gen):
    p = scene(gen, 500, 3)
    capture = (
        3,
        p.means,
        p.features_dc,
        p.features_rest,
        p.log_scales,
        p.rotations_raw,
        p.opacity_logits[:, None],
        torch.zeros(500),
        torch.zeros(500, 1),
        torch.zeros(500, 1),
        {"state": {}, "param_groups": []},
        2.5,
    )
    torch.save((capture, 7000), tmp_path / "chkpnt7000.pth")
    r = lint(tmp_path / "chkpnt7000.pth")
    assert r.verdict == "ok" and "iteration 7000" in (r.layout or "")


def test_nan_inf_and_overflow_are_counted(tmp_path, gen):
    p = scene(gen, 1000, 0)
    cols = ply_columns(p)
    cols["scale_0"] = cols["scale_0"].copy()
    cols["scale_0"][:3] = np.nan
    cols["f_dc_1"] = cols["f_dc_1"].copy()
    cols["f_dc_1"][5] = np.inf
    (tmp_path / "nan.ply").write_bytes(make_ply(cols))
    r = lint(tmp_path / "nan.ply")
    by = {q.name: q for q in r.params}
    assert r.verdict == "suspicious" and r.exit_code == 1
    assert by["scales"].evidence["nonfinite"] == 3 and by["features"].evidence["nonfinite"] == 1
    cols = ply_columns(p)
    cols["scale_1"] = cols["scale_1"].copy()
    cols["scale_1"][:10] = 120.0  # exp overflows float32
    (tmp_path / "big.ply").write_bytes(make_ply(cols))
    by = {q.name: q for q in lint(tmp_path / "big.ply").params}
    assert by["scales"].verdict == "suspicious" and by["scales"].evidence["exp_overflow"] == 10


def test_rotations_normalized_alone_is_not_a_finding(tmp_path, gen):
    p = scene(gen, 1000, 1)
    p.rotations_raw = rotation_activation(p.rotations_raw)
    write_ply(p, tmp_path / "unit.ply")
    got = verdicts(tmp_path / "unit.ply")
    assert got["rotations"] == "activated" and got["file"] == "ok"
    p.rotations_raw = torch.tensor([1.0, 0, 0, 0]).repeat(1000, 1)  # 3DGS's initialization
    write_ply(p, tmp_path / "init.ply")
    assert verdicts(tmp_path / "init.ply")["rotations"] == "ok"


# --- unreadable ------------------------------------------------------------------------------


def test_unreadable_files_say_why(tmp_path, gen):
    write_ply(scene(gen, 400, 1), tmp_path / "full.ply")
    data = (tmp_path / "full.ply").read_bytes()
    (tmp_path / "cut.ply").write_bytes(data[: len(data) - 1000])
    (tmp_path / "not.ply").write_bytes(b"hello world")
    cols = ply_columns(scene(gen, 10, 0))
    del cols["opacity"], cols["rot_2"]
    (tmp_path / "missing.ply").write_bytes(make_ply(cols))
    (tmp_path / "cut.pt").write_bytes(b"PK\x03\x04" + b"\0" * 50)
    reasons = {
        name: lint(tmp_path / name)
        for name in ("cut.ply", "not.ply", "missing.ply", "cut.pt", "absent.ply")
    }
    assert all(r.verdict == "unreadable" and r.exit_code == 2 for r in reasons.values())
    assert "truncated" in str(reasons["cut.ply"].error)
    assert "not a PLY" in str(reasons["not.ply"].error)
    assert "opacity" in str(reasons["missing.ply"].error)
    assert "rot_2" in str(reasons["missing.ply"].error)
    assert "corrupt or truncated" in str(reasons["cut.pt"].error)
    assert "no such file" in str(reasons["absent.ply"].error)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    cut=st.integers(min_value=0, max_value=4000),
    flips=st.lists(
        st.tuples(st.integers(min_value=0, max_value=4000), st.integers(0, 255)), max_size=8
    ),
)
def test_fuzzed_ply_never_raises(tmp_path, cut, flips):
    p = trained_like(60, 1, torch.Generator().manual_seed(5))
    path = tmp_path / "f.ply"
    write_ply(p, path)
    data = bytearray(path.read_bytes())
    for at, value in flips:
        if at < len(data):
            data[at] = value
    path.write_bytes(bytes(data[: len(data) - cut]))
    r = lint(path)  # never an exception: a verdict, or unreadable with a reason
    assert r.verdict in ("ok", "suspicious", "activated", "unreadable")
    assert (r.error is not None) == (r.verdict == "unreadable")


# --- the command -----------------------------------------------------------------------------


def test_cli_json_text_exit_codes_and_render(tmp_path, gen, capsys):
    p = scene(gen, 600, 1)
    write_ply(p, tmp_path / "raw.ply")
    write_ply(activated(p), tmp_path / "act.ply")
    assert cli.main(["lint-checkpoint", str(tmp_path / "raw.ply")]) == 0
    assert "OK" in capsys.readouterr().out
    code = cli.main(
        [
            "lint-checkpoint",
            "--json",
            "--render",
            "320x240",
            str(tmp_path / "raw.ply"),
            str(tmp_path / "act.ply"),
        ]
    )
    assert code == 1
    raw, act = json.loads(capsys.readouterr().out)
    assert raw["verdict"] == "ok" and act["verdict"] == "activated"
    assert act["render"]["correct_load"] == "as_stored"
    assert "CPU estimate" in act["render"]["method"]
    twice, once = act["render"]["3dgs_load"], act["render"]["as_stored"]
    assert twice["overlaps"] > 10 * once["overlaps"] and twice["bytes"] == 24 * twice["overlaps"]
    assert raw["render"]["3dgs_load"]["overlaps"] == once["overlaps"]  # same scene, loaded right
    assert cli.main(["lint-checkpoint", str(tmp_path / "act.ply"), "--render", "320x240"]) == 1
    out = capsys.readouterr().out
    assert "[correct load]" in out and "binning needs" in out and "fix:" in out
    assert cli.main(["lint-checkpoint", str(tmp_path / "raw.ply"), str(tmp_path / "nope.ply")]) == 2
    assert "UNREADABLE" in capsys.readouterr().out
    assert cli.main(["lint-checkpoint", str(tmp_path / "raw.ply"), "--render", "big"]) == 2


# --- check_roundtrip -------------------------------------------------------------------------


def test_roundtrip_of_correct_code_passes():
    report = check_roundtrip(write_ply, read_ply)
    assert report.ok and set(report.fields.values()) == {"same"}
    assert "max |difference| 0" in str(report.render)


def test_roundtrip_names_double_activation():
    def save_activated(p, path):
        write_pt(
            activated(p).__class__(
                p.means,
                p.features_dc,
                p.features_rest,
                scale_activation(p.log_scales),
                p.opacity_logits,
                p.rotations_raw,
                p.sh_degree,
            ),
            path,
        )

    def load_3dgs(path):  # returns 3DGS's attribute names, like GaussianModel
        d = torch.load(path, weights_only=True)
        return {
            "_xyz": d["means"],
            "_features_dc": d["features_dc"],
            "_features_rest": d["features_rest"],
            "_scaling": d["log_scales"],
            "_opacity": d["opacity_logits"][:, None],
            "_rotation": d["rotations_raw"],
        }

    with pytest.raises(RoundtripError) as err:
        check_roundtrip(save_activated, load_3dgs, suffix=".pt")
    report = err.value.report
    assert report.activated == ["log_scales"]
    assert str(err.value).startswith("activation applied twice: log_scales")
    assert "came back as exp(saved)" in report.fields["log_scales"]
    assert report.fields["opacity_logits"] == "same"


def test_roundtrip_other_differences_are_not_called_activation():
    def lossy(path):
        p = read_ply(path)
        p.means = p.means.half().float()
        return p

    with pytest.raises(RoundtripError) as err:
        check_roundtrip(write_ply, lossy, render_size=None)
    assert err.value.report.activated == []
    assert err.value.report.fields["means"].startswith("differs")
