"""Self-test of the ``checkpoint-reads`` detector (issue 27): a case reads a 3DGS checkpoint
that was saved *activated*, the way 3DGS reads it (``GaussianModel.load_ply``'s
``PlyData.read``, ``train.py``'s ``torch.load`` of the ``(capture, iteration)`` tuple), applies
the activations again and renders. The scene is small: the render fits in memory and the case
passes, with no ``check_roundtrip`` and no out-of-memory to give it away.

Expected (gpucheck.selftest.DEFECTS): ``test_activated_checkpoint_rendered`` (GPU, rendered
with ``gpucheck.ops.rasterize``) and ``test_activated_checkpoint_read`` (CPU, read only) each
get a ``double-activation`` error naming the file; their twins reading the raw checkpoint,
``test_raw_checkpoint_rendered`` and ``test_raw_checkpoint_read``, draw no finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
plyfile = pytest.importorskip("plyfile")  # 3DGS reads its PLYs with it

SUFFIXES = (".ply", ".pt")
N, SIZE, FOCAL = 4096, 256, 200.0


def _trained(seed):
    """Raw parameters shaped like a trained scene in front of an identity camera: log-scales
    around -5, opacity logits spread well outside [0, 1], raw quaternions."""
    from gpucheck.checkpoints.roundtrip import sample_params

    p = sample_params(N, sh_degree=0, seed=seed)
    p.log_scales = p.log_scales - 2.0
    return p


def _save(tmp_path, suffix, activated):
    """Write the scene raw, or (the defect, story 3) with the activations applied first."""
    import gpucheck.checkpoints as ck
    from gpucheck.checkpoints import activations as act

    p = _trained(int(torch.randint(1 << 30, ())))
    if activated:
        p = ck.GaussianParams(
            p.means,
            p.features_dc,
            p.features_rest,
            act.scale_activation(p.log_scales),
            act.opacity_activation(p.opacity_logits),
            act.rotation_activation(p.rotations_raw),
            p.sh_degree,
        )
    path = tmp_path / ("point_cloud.ply" if suffix == ".ply" else "chkpnt30000.pth")
    if suffix == ".ply":
        ck.write_ply(p, path)
    else:
        ck.write_pt(p, path, form="capture", iteration=30000)
    return path


def _load_3dgs(path: Path):
    """The raw tensors as 3DGS loads them: ``load_ply`` or ``restore(torch.load(...)[0])``."""
    if path.suffix == ".ply":
        v = plyfile.PlyData.read(str(path)).elements[0]

        def cols(*names):
            return torch.tensor(
                np.stack([np.asarray(v[n]) for n in names], axis=1), dtype=torch.float
            )

        return (
            cols("x", "y", "z"),
            cols("f_dc_0", "f_dc_1", "f_dc_2")[:, None, :],
            cols("scale_0", "scale_1", "scale_2"),
            cols("rot_0", "rot_1", "rot_2", "rot_3"),
            cols("opacity"),
        )
    (model_params, _first_iter) = torch.load(path)
    (_degree, xyz, f_dc, _f_rest, scaling, rotation, opacity, *_training_state) = model_params
    return xyz, f_dc, scaling, rotation, opacity


def _render(path, device):
    """Load as 3DGS does, activate (exp, normalize, sigmoid) and render on ``device``."""
    from gpucheck.ops import rasterize

    xyz, f_dc, scaling, rotation, opacity = _load_3dgs(path)
    return rasterize(
        xyz.to(device).contiguous(),
        torch.exp(scaling).to(device).contiguous(),
        torch.nn.functional.normalize(rotation).to(device).contiguous(),
        torch.sigmoid(opacity[:, 0]).to(device).contiguous(),
        sh=f_dc.to(device).contiguous(),
        sh_degree=0,
        viewmat=torch.eye(4, device=device),
        K=torch.tensor([[FOCAL, 0, SIZE / 2], [0, FOCAL, SIZE / 2], [0, 0, 1]], device=device),
        width=SIZE,
        height=SIZE,
    )


def _renders(out):
    assert bool(torch.isfinite(out.image).all()) and float(out.alpha.max()) > 0.5


@pytest.mark.gpu
@pytest.mark.parametrize("suffix", SUFFIXES)
def test_activated_checkpoint_rendered(gpu_device, tmp_path, suffix):
    # the render fits and passes: only the lint of the file the case read can tell
    _renders(_render(_save(tmp_path, suffix, activated=True), gpu_device))


@pytest.mark.gpu
@pytest.mark.parametrize("suffix", SUFFIXES)
def test_raw_checkpoint_rendered(gpu_device, tmp_path, suffix):
    _renders(_render(_save(tmp_path, suffix, activated=False), gpu_device))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_activated_checkpoint_read(tmp_path, suffix):
    xyz, *_ = _load_3dgs(_save(tmp_path, suffix, activated=True))
    assert xyz.shape == (N, 3)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_raw_checkpoint_read(tmp_path, suffix):
    xyz, *_ = _load_3dgs(_save(tmp_path, suffix, activated=False))
    assert xyz.shape == (N, 3)
