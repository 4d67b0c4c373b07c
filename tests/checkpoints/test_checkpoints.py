"""CPU tests of gpucheck.checkpoints: PLY and .pt round trips, PLYs built byte by byte in this
file (not by our writer), 3DGS capture tuples built as 3DGS's train.py saves them, clear
CheckpointErrors for broken files, and a hypothesis fuzz of the PLY reader."""

from __future__ import annotations

import math
import os
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from checkpointkit import make_ply, ply_columns, three_dgs_capture, trained_like
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucheck.checkpoints import (
    CheckpointError,
    GaussianParams,
    load,
    read_ply,
    read_pt,
    save,
    write_ply,
    write_pt,
)
from gpucheck.checkpoints.activations import (
    inverse_opacity_activation,
    inverse_rotation_activation,
    inverse_scale_activation,
)
from gpucheck.errors import GpucheckError
from gpucheck.reference import rasterize


@pytest.fixture
def gen() -> torch.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return torch.Generator().manual_seed(seed)


def assert_same(a: GaussianParams, b: GaussianParams) -> None:
    for (name, x), y in zip(a.tensors().items(), b.tensors().values(), strict=True):
        assert x.shape == y.shape, name
        assert torch.equal(x.to(y.dtype), y), name


@pytest.mark.parametrize("fmt", ["binary_little_endian", "binary_big_endian", "ascii"])
@pytest.mark.parametrize("degree", [0, 1, 3])
def test_reads_independently_written_ply(
    tmp_path: Path, gen: torch.Generator, fmt: str, degree: int
) -> None:
    p = trained_like(7, degree, gen)
    cols = ply_columns(p)
    # extra properties mixed in, another numeric type, and an extra element
    cols = {
        "extra_before": np.arange(7, dtype=np.float32),
        **cols,
        "red": np.arange(7, dtype=np.uint8),
        "confidence": np.linspace(0, 1, 7),
    }
    types = {"red": "uchar", "confidence": "double"}
    path = tmp_path / "scene.ply"
    path.write_bytes(make_ply(cols, fmt, types, extra="element camera 0\nproperty float f\n"))
    got = read_ply(path)
    assert got.sh_degree == degree and got.features_rest.shape == (7, (degree + 1) ** 2 - 1, 3)
    assert_same(p, got)
    assert_same(p, load(path))


def test_reads_other_property_types(tmp_path: Path, gen: torch.Generator) -> None:
    p = trained_like(4, 1, gen)
    cols = {k: v.astype(np.float64) for k, v in ply_columns(p).items()}
    path = tmp_path / "double.ply"
    path.write_bytes(make_ply(cols, types=dict.fromkeys(cols, "double")))
    assert_same(p, read_ply(path))  # float32 values survive a float64 file exactly


@pytest.mark.parametrize("degree", [0, 2, 3])
def test_ply_round_trip_and_writer_layout(
    tmp_path: Path, gen: torch.Generator, degree: int
) -> None:
    p = trained_like(9, degree, gen)
    path = tmp_path / "out.ply"
    write_ply(p, path)
    assert_same(p, read_ply(path))
    # the bytes, read without plyfile: 3DGS's header order and little-endian float32 rows
    data = path.read_bytes()
    end = data.index(b"end_header\n") + len(b"end_header\n")
    header = data[:end].decode("ascii").splitlines()
    assert header[:3] == ["ply", "format binary_little_endian 1.0", "element vertex 9"]
    want = ply_columns(p)
    assert header[3:-1] == [f"property float {name}" for name in want]
    rows = np.frombuffer(data[end:], dtype=[(name, "<f4") for name in want])
    assert len(rows) == 9
    for name, col in want.items():
        np.testing.assert_array_equal(rows[name], col, err_msg=name)


def test_pt_dict_round_trip(tmp_path: Path, gen: torch.Generator) -> None:
    p = trained_like(6, 2, gen)
    p.sh_degree = 1  # active degree below the stored one
    save(p, tmp_path / "a.pt")
    got = load(tmp_path / "a.pt")
    assert_same(p, got)
    assert got.sh_degree == 1
    assert read_pt(tmp_path / "a.pt").form == "dict"


def test_reads_3dgs_capture_tuple(tmp_path: Path, gen: torch.Generator) -> None:
    p = trained_like(5, 3, gen)
    p.sh_degree = 2
    capture = three_dgs_capture(p, gen)
    path = tmp_path / "chkpnt30000.pth"
    torch.save((capture, 30000), path)
    ck = read_pt(path)
    assert ck.form == "capture" and ck.iteration == 30000 and ck.params.sh_degree == 2
    post_step = GaussianParams(
        capture[1].detach(),
        capture[2].detach(),
        capture[3].detach(),
        capture[4].detach(),
        capture[6].detach()[:, 0],
        capture[5].detach(),
        2,
    )
    assert_same(post_step, ck.params)
    assert ck.training_state["spatial_lr_scale"] == 4.5
    assert len(ck.training_state["optimizer_state_dict"]["state"]) == 6
    # write it back in the same form, keeping the training state: 3DGS would read the same
    write_pt(
        ck.params,
        tmp_path / "again.pth",
        form="capture",
        iteration=ck.iteration,
        training_state=ck.training_state,
    )
    (again, iteration) = torch.load(tmp_path / "again.pth", weights_only=True)
    assert iteration == 30000 and len(again) == 12 and again[0] == 2
    assert again[6].shape == (5, 1)
    for a, b in zip(capture, again, strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a.detach(), b)
    assert again[10]["param_groups"] == capture[10]["param_groups"]


def test_capture_round_trip_without_training_state(tmp_path: Path, gen: torch.Generator) -> None:
    p = trained_like(4, 1, gen)
    write_pt(p, tmp_path / "c.pth", form="capture", iteration=7)
    ck = read_pt(tmp_path / "c.pth")
    assert ck.form == "capture" and ck.iteration == 7
    assert_same(p, ck.params)


def test_reads_dict_with_3dgs_attribute_names(tmp_path: Path, gen: torch.Generator) -> None:
    p = trained_like(3, 1, gen)
    torch.save(
        {
            "_xyz": p.means,
            "_features_dc": p.features_dc,
            "_features_rest": p.features_rest,
            "_scaling": p.log_scales,
            "_opacity": p.opacity_logits[:, None],
            "_rotation": p.rotations_raw,
        },
        tmp_path / "m.pt",
    )
    got = load(tmp_path / "m.pt")
    assert_same(p, got)
    assert got.sh_degree == 1


def test_activated_values_and_inverses(gen: torch.Generator) -> None:
    p = trained_like(50, 3, gen)
    a = p.activated()
    torch.testing.assert_close(
        a.scales,
        torch.tensor([[math.exp(v) for v in row] for row in p.log_scales.tolist()]),
        rtol=1e-6,
        atol=0,
    )
    torch.testing.assert_close(
        a.opacities,
        torch.tensor([1 / (1 + math.exp(-v)) for v in p.opacity_logits.tolist()]),
        rtol=1e-6,
        atol=1e-7,
    )
    torch.testing.assert_close(a.rotations.norm(dim=1), torch.ones(50))
    assert a.sh.shape == (50, 16, 3) and torch.equal(a.sh[:, 0], p.features_dc[:, 0])
    assert bool((a.scales > 0).all()) and bool(((a.opacities >= 0) & (a.opacities <= 1)).all())
    torch.testing.assert_close(inverse_scale_activation(a.scales), p.log_scales)
    # logit(sigmoid(x)) in float32: p (or 1 - p, near 1) carries a rounding of u = 2^-24 of
    # 1, i.e. a relative error of u / p (u / (1 - p)) that the logit passes on in full: the
    # error bound grows like e^|x| (a fixed 1e-4 failed for logits beyond ~9, 1 seed in ~50)
    u = 2.0**-24
    bound = 4 * u * (1 / a.opacities + 1 / (1 - a.opacities)) + 1e-6
    err = (inverse_opacity_activation(a.opacities) - p.opacity_logits).abs()
    assert bool((err <= bound).all()), f"logit(sigmoid(x)) off by {err.max():.3g}"
    torch.testing.assert_close(inverse_rotation_activation(a.rotations), a.rotations)


def test_loaded_checkpoint_renders(tmp_path: Path, gen: torch.Generator) -> None:
    p = trained_like(30, 3, gen)
    p.means = p.means * 0.3 + torch.tensor([0.0, 0.0, 3.0])
    p.log_scales = p.log_scales + 3  # ~0.05 world units
    save(p, tmp_path / "s.ply")
    g = load(tmp_path / "s.ply").activated()
    res = rasterize(
        **g._asdict(),
        viewmat=torch.eye(4),
        K=torch.tensor([[30.0, 0, 12], [0, 30.0, 10], [0, 0, 1]]),
        width=24,
        height=20,
        max_bytes=10_000,
    )
    assert res.image.shape == (3, 20, 24) and float(res.alpha.max()) > 0.1


# ---- broken files ------------------------------------------------------------------------


def good_cols(gen: torch.Generator, degree: int = 1) -> dict[str, np.ndarray]:
    return ply_columns(trained_like(5, degree, gen))


def expect_error(path: Path, *fragments: str) -> str:
    with pytest.raises(CheckpointError) as info:
        load(path)
    msg = str(info.value)
    assert str(path) in msg
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


def test_not_a_ply(tmp_path: Path) -> None:
    (tmp_path / "a.ply").write_bytes(b"solid mesh\nfacet normal 0 0 1\n")
    expect_error(tmp_path / "a.ply", "not a PLY")
    (tmp_path / "b.ply").write_bytes(b"")
    expect_error(tmp_path / "b.ply", "not a PLY")


def test_truncated_binary_ply(tmp_path: Path, gen: torch.Generator) -> None:
    data = make_ply(good_cols(gen))
    (tmp_path / "t.ply").write_bytes(data[:-10])
    expect_error(
        tmp_path / "t.ply", "truncated", "promises 5 'vertex' rows", "after 4 complete row"
    )
    (tmp_path / "h.ply").write_bytes(data[:40])
    expect_error(tmp_path / "h.ply", "malformed PLY header", "end-of-file")


def test_truncated_ascii_ply(tmp_path: Path, gen: torch.Generator) -> None:
    data = make_ply(good_cols(gen), "ascii")
    lines = data.split(b"\n")
    (tmp_path / "t.ply").write_bytes(b"\n".join(lines[:-3]) + b"\n")
    expect_error(tmp_path / "t.ply", "truncated", "promises 5 'vertex' rows")


def test_missing_fields_are_listed(tmp_path: Path, gen: torch.Generator) -> None:
    cols = good_cols(gen)
    for name in ("opacity", "scale_1", "rot_3"):
        del cols[name]
    (tmp_path / "m.ply").write_bytes(make_ply(cols))
    expect_error(tmp_path / "m.ply", "missing vertex properties: opacity scale_1 rot_3")


def test_wrong_f_rest_counts(tmp_path: Path, gen: torch.Generator) -> None:
    cols = good_cols(gen, 1)
    cols["f_rest_9"] = cols["f_rest_0"]  # 10 coefficients
    (tmp_path / "c.ply").write_bytes(make_ply(cols))
    expect_error(tmp_path / "c.ply", "10 f_rest properties", "0, 9, 24 or 45")
    cols = good_cols(gen, 1)
    del cols["f_rest_4"]
    (tmp_path / "g.ply").write_bytes(make_ply(cols))
    expect_error(tmp_path / "g.ply", "not numbered", "missing: f_rest_4")


def test_nan_and_inf_values_are_counted(tmp_path: Path, gen: torch.Generator) -> None:
    cols = good_cols(gen)
    cols["scale_2"][[0, 3]] = np.nan
    cols["y"][1] = np.inf
    (tmp_path / "n.ply").write_bytes(make_ply(cols))
    expect_error(tmp_path / "n.ply", "NaN/inf", "y (1 of 5)", "scale_2 (2 of 5)")


def test_list_property_where_a_scalar_belongs(tmp_path: Path, gen: torch.Generator) -> None:
    cols = good_cols(gen)
    del cols["opacity"]
    head, body = make_ply(cols, "ascii").split(b"end_header\n")
    head += b"property list uchar float opacity\nend_header\n"
    body = b"".join(line + b" 1 0.5\n" for line in body.split(b"\n") if line)
    (tmp_path / "l.ply").write_bytes(head + body)
    expect_error(tmp_path / "l.ply", "opacity is not a numeric scalar")


def test_pt_problems(tmp_path: Path, gen: torch.Generator) -> None:
    p = trained_like(4, 1, gen)
    good = {**p.tensors(), "sh_degree": 1}
    torch.save({**good, "log_scales": torch.zeros(4, 2)}, tmp_path / "shape.pt")
    expect_error(
        tmp_path / "shape.pt", "wrong tensor shapes", "log_scales is [4, 2], expected [4, 3]"
    )
    torch.save({**good, "features_rest": torch.zeros(4, 5, 3)}, tmp_path / "rest.pt")
    expect_error(tmp_path / "rest.pt", "features_rest is [4, 5, 3]")
    torch.save({k: v for k, v in good.items() if k != "rotations_raw"}, tmp_path / "key.pt")
    expect_error(tmp_path / "key.pt", "missing keys rotations_raw")
    torch.save({**good, "sh_degree": 3}, tmp_path / "deg.pt")
    expect_error(tmp_path / "deg.pt", "sh_degree must be an int in 0..1, got 3")
    torch.save({**good, "means": [[0.0, 0.0, 0.0]] * 4}, tmp_path / "list.pt")
    expect_error(tmp_path / "list.pt", "means must be a tensor, got list")
    torch.save(
        {**good, "opacity_logits": torch.tensor([0.0, math.nan, 1.0, 2.0])}, tmp_path / "nan.pt"
    )
    expect_error(tmp_path / "nan.pt", "NaN/inf values in opacity_logits (1 of 4)")
    torch.save(((1, p.means), 100), tmp_path / "cap.pt")
    expect_error(tmp_path / "cap.pt", "has 12 items", "this one has 2")
    torch.save([p.means], tmp_path / "what.pt")
    expect_error(tmp_path / "what.pt", "unknown .pt layout")
    data = (tmp_path / "shape.pt").read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    expect_error(tmp_path / "trunc.pt", "not a readable torch.save file")
    (tmp_path / "text.pt").write_bytes(b"not a checkpoint")
    expect_error(tmp_path / "text.pt", "not a torch.save file", "starts with b'not '")
    torch.save(good, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert_same(p, load(tmp_path / "legacy.pt"))


class Opaque:
    """Not a tensor or container: torch.load(weights_only=True) must refuse it."""


def test_pt_with_arbitrary_objects_is_refused(tmp_path: Path) -> None:
    torch.save({"model": Opaque()}, tmp_path / "obj.pt")
    expect_error(tmp_path / "obj.pt", "refused", "weights_only=True")


def test_paths_and_suffixes(tmp_path: Path, gen: torch.Generator) -> None:
    expect_error(tmp_path / "missing.ply", "no such file")
    with pytest.raises(CheckpointError, match=r"unknown checkpoint suffix '\.npz'"):
        load(tmp_path / "x.npz")
    with pytest.raises(CheckpointError, match="unknown checkpoint suffix"):
        save(trained_like(2, 0, gen), tmp_path / "x.txt")
    bad = trained_like(2, 0, gen)
    bad.means = bad.means.clone()
    bad.means[0, 0] = math.nan
    with pytest.raises(CheckpointError, match=r"refusing to write.*NaN/inf values in means"):
        save(bad, tmp_path / "bad.ply")
    assert not (tmp_path / "bad.ply").exists()
    assert issubclass(CheckpointError, GpucheckError)


# ---- fuzzing -----------------------------------------------------------------------------

_FUZZ_SEED = torch.Generator().manual_seed(1234)
_VALID = {
    fmt: make_ply(ply_columns(trained_like(3, 1, _FUZZ_SEED)), fmt)
    for fmt in ("binary_little_endian", "ascii")
}
_FUZZ_DIR = tempfile.TemporaryDirectory(prefix="gpucheck-fuzz-")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(sorted(_VALID)),
    cut=st.integers(0, 2000),
    edits=st.lists(
        st.tuples(st.integers(0, 2000), st.binary(min_size=0, max_size=4), st.integers(0, 3)),
        max_size=4,
    ),
)
def test_fuzzed_ply_raises_only_checkpoint_error(
    fmt: str, cut: int, edits: list[tuple[int, bytes, int]]
) -> None:
    data = bytearray(_VALID[fmt])
    for pos, new, drop in edits:  # replace `drop` bytes at pos by `new`
        pos %= len(data) + 1
        data[pos : pos + drop] = new
    if cut < len(data) and cut % 3 == 0:  # and sometimes truncate
        data = data[:cut]
    path = Path(_FUZZ_DIR.name) / "fuzz.ply"
    path.write_bytes(bytes(data))
    try:
        got = read_ply(path)
    except CheckpointError as e:
        assert str(path) in str(e)
    else:
        assert isinstance(got, GaussianParams) and torch.isfinite(got.means).all()


def test_fuzz_corpus_covers_both_formats() -> None:
    """The fuzz inputs start from files the reader accepts."""
    for fmt, data in _VALID.items():
        path = Path(_FUZZ_DIR.name) / f"valid-{fmt}.ply"
        path.write_bytes(data)
        assert read_ply(path).num_gaussians == 3
    assert struct.unpack("<f", _VALID["binary_little_endian"][-4:])[0] == pytest.approx(
        float(trained_like(3, 1, torch.Generator().manual_seed(1234)).rotations_raw[-1, -1])
    )
