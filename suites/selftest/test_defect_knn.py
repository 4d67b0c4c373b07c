"""Self-test of the device, numerics and initcheck detectors on gpucheck's own KNN, built from
csrc/knn with one ``GPUCHECK_DEFECT_*`` macro each (``gpucheck._csrc.defects.DEFECTS``; ops under
``torch.ops.gpucheck_defect_<name>``, next to the real extension in one worker).

Every case is correct usage and passes: only the detector meant for its defect can tell.
Expected (gpucheck.selftest.DEFECTS): ``test_no_guard_knn`` fails with another device current
and passes with its target current (wrong-device diagnosis, 2 GPUs); ``test_set_device_knn``
leaves another device current (device-state-leak warning naming the op, 2 GPUs);
``test_output_current_device_knn`` gets its result on the caller's current device
(wrong-device from the op-level check, 2 GPUs); ``test_uninit_read_knn`` reads the output
before writing it (initcheck, kernel ``query_kernel``); ``test_nondeterminism_knn`` gets a
result one ulp off on every other call (numerics). ``test_clean_knn`` does all of that with
the real extension and must draw no finding.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

K = 3
N = 1025  # two tree levels and a partial leaf
U = 2.0**-24
#: suites/knn/test_knn.py's bound of the op against the float64 oracle, atol 0
RTOL = 2 * (K + 6) * U
#: one ulp (2u relative) more: the slack a determinism-agnostic training step allows
RTOL_ANY_RUN = RTOL + 2 * U

pytestmark = pytest.mark.gpu


def _points(device):
    return torch.rand(N, 3, device=device) * 10 - 5  # fresh random, never zeros


def _check(got, points, rtol=RTOL):
    from gpucheck.reference import knn_mean_sq_dist as reference

    want = reference(points.cpu(), K)
    torch.testing.assert_close(got.cpu().double(), want, rtol=rtol, atol=0.0)


def _needs_other(other_device, why):
    # Skip on one GPU only: in the differential re-run (its target current, other_device
    # None) the case must run, and pass, for the wrong-device diagnosis.
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs another device current ({why}); one GPU is visible")


def test_no_guard_knn(defect_ops, gpu_device, other_device):
    _needs_other(other_device, "to provoke a launch on the wrong device")
    points = _points(gpu_device)
    got = defect_ops("no_guard_knn").knn_mean_sq_dist(points, K)
    torch.cuda.synchronize(gpu_device)
    _check(got, points)


def test_set_device_knn(defect_ops, gpu_device, other_device):
    _needs_other(other_device, "the caller's device a bare cudaSetDevice overwrites")
    points = _points(gpu_device)
    _check(defect_ops("set_device").knn_mean_sq_dist(points, K), points)


def test_output_current_device_knn(defect_ops, gpu_device, other_device):
    _needs_other(other_device, "where a result allocated on the current device lands")
    points = _points(gpu_device)
    _check(defect_ops("output_current_device").knn_mean_sq_dist(points, K), points)


@pytest.mark.sanitizer(tools=("initcheck",))
def test_uninit_read_knn(sanitizer_defect_ops, gpu_device):
    points = _points(gpu_device)
    _check(sanitizer_defect_ops("uninit_read").knn_mean_sq_dist(points, K), points)


def test_nondeterminism_knn(defect_ops, gpu_device):
    points = _points(gpu_device)
    op = defect_ops("nondeterminism").knn_mean_sq_dist
    for _ in range(2):  # a training step runs it again on the same cloud
        _check(op(points, K), points, rtol=RTOL_ANY_RUN)


@pytest.mark.sanitizer(tools=("initcheck",))
def test_clean_knn(clean_ops, gpu_device):
    points = _points(gpu_device)
    for _ in range(2):
        _check(clean_ops.knn_mean_sq_dist(points, K), points)
