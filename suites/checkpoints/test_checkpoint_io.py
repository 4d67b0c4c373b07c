"""3DGS checkpoints on this machine (failure 3 of docs/failures.md): gpucheck's checkpoint I/O
(``gpucheck.checkpoints``) and its activation lint (``gpucheck lint-checkpoint``) with this
machine's torch, numpy and plyfile. A CPU suite: it runs without a GPU.

A checkpoint stores *raw* parameters (log-scales, opacity logits, unnormalized quaternions);
one saved after activation and activated again on load makes every Gaussian enormous (the
52 GiB request of a 30k-iteration resume). Each case writes real files in both formats and
reads them back the way a user's code would. (A loader that activates twice is a finding of
the ``double-activation`` detector: ``gpucheck selftest`` plants one.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpucheck import checkpoints
from gpucheck.checkpoints import GaussianParams, check_roundtrip
from gpucheck.checkpoints.activations import (
    opacity_activation,
    rotation_activation,
    scale_activation,
)
from gpucheck.checkpoints.lint import lint
from gpucheck.checkpoints.roundtrip import sample_params

SUFFIXES = (".ply", ".pt")


def _trained_like(seed: int, n: int = 3000) -> GaussianParams:
    """A raw scene as training leaves it: log-scales around -5, logits spread wide."""
    p = sample_params(n, sh_degree=3, seed=seed)
    p.log_scales = p.log_scales - 2.0
    return p


def _activated(p: GaussianParams) -> GaussianParams:
    """What a buggy save stores: activated values in the raw fields."""
    return GaussianParams(
        p.means,
        p.features_dc,
        p.features_rest,
        scale_activation(p.log_scales),
        opacity_activation(p.opacity_logits),
        rotation_activation(p.rotations_raw),
        p.sh_degree,
    )


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_save_then_load_gives_back_the_raw_parameters(suffix: str) -> None:
    report = check_roundtrip(
        checkpoints.save, checkpoints.load, _trained_like(seed=1), suffix=suffix
    )
    assert report.ok


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_lint_tells_raw_from_activated_files(tmp_path: Path, suffix: str) -> None:
    p = _trained_like(seed=3)
    raw, act = tmp_path / f"raw{suffix}", tmp_path / f"activated{suffix}"
    checkpoints.save(p, raw)
    checkpoints.save(_activated(p), act)
    good = lint(raw)
    assert good.verdict == "ok" and good.exit_code == 0, good
    bad = lint(act)
    assert bad.verdict == "activated" and bad.exit_code == 1, bad
    verdicts = {q.name: q.verdict for q in bad.params}
    assert verdicts["scales"] == verdicts["opacities"] == "activated", verdicts
    assert bad.fix and "log" in bad.fix


def test_an_activated_checkpoint_would_bin_far_more_tiles(tmp_path: Path) -> None:
    """The render estimate of ``lint-checkpoint --render``: loaded with 3DGS conventions, an
    activated file's Gaussians (exp of an already positive scale) overlap far more tiles."""
    path = tmp_path / "activated.ply"
    checkpoints.save(_activated(_trained_like(seed=4)), path)
    render = lint(path, render=(1920, 1080)).render
    assert render is not None and render["correct_load"] == "as_stored"
    wrong, right = render["3dgs_load"], render["as_stored"]
    assert wrong["overlaps"] > 100 * max(right["overlaps"], 1), render


def test_a_truncated_file_is_named_not_crashed_on(tmp_path: Path) -> None:
    path = tmp_path / "point_cloud.ply"
    checkpoints.save(_trained_like(seed=5, n=500), path)
    path.write_bytes(path.read_bytes()[:-1000])
    report = lint(path)
    assert report.verdict == "unreadable" and report.exit_code == 2
    assert str(path) in (report.error or "") or path.name in (report.error or "")
    with pytest.raises(checkpoints.CheckpointError):
        checkpoints.load(path)


def test_saved_values_are_float32_as_3dgs_writes_them(tmp_path: Path) -> None:
    p = _trained_like(seed=6, n=100)
    checkpoints.save(p, tmp_path / "x.ply")
    back = checkpoints.load(tmp_path / "x.ply")
    assert back.means.dtype == torch.float32 and back.sh_degree == 3
    torch.testing.assert_close(back.log_scales, p.log_scales.float(), rtol=0, atol=0)
