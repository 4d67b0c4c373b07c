"""imbalance: the same case's memory compared across devices, on case records."""

from __future__ import annotations

from memkit import MiB, read_back

from gpucheck.detectors.imbalance import imbalances
from gpucheck.model.results import CaseRecord


def peak(
    device: str,
    torch_peak: int,
    nvml_peak: int,
    case: str = "test_i.py::test_i[{d}]",
    reserved: int | None = None,
) -> CaseRecord:
    memory = {"torch_peak_allocated": torch_peak, "nvml_peak_used": nvml_peak}
    if reserved is not None:
        memory["torch_peak_reserved"] = reserved
    return read_back(
        {
            "record": "case",
            "device": device,
            "suite": "s",
            "mode": "blocking+nvml",
            "case": case.format(d=device.replace(":", "")),
            "status": "passed",
            "memory": memory,
        }
    )


def test_imbalance_across_devices():
    recs = [
        peak("cuda:0", 900 * MiB, 1500 * MiB),
        peak("cuda:1", 100 * MiB, 700 * MiB),
        peak("cuda:0", 100 * MiB, 700 * MiB, "test_i.py::test_ok[{d}]"),
        peak("cuda:1", 110 * MiB, 720 * MiB, "test_i.py::test_ok[{d}]"),
    ]
    [f] = imbalances(recs)
    assert (f.kind, f.severity, f.device) == ("imbalance", "warning", "cuda:0")
    assert f.case == "test_i.py::test_i[cuda0]" and "800.0 MiB more than cuda:1" in (
        f.evidence or ""
    )
    assert imbalances([r for r in recs if r.device == "cuda:0"]) == []


def test_imbalance_leaves_out_the_pool_earlier_cases_reserved():
    # A resumed worker ran this case with 10 GB still reserved by the cases before it; the
    # first run's worker had released none of it yet: the same allocations, NVML apart by GB.
    GiB = 1024 * MiB
    recs = [
        peak("cuda:0", 40 * MiB, 10 * GiB + 700 * MiB, reserved=10 * GiB),
        peak("cuda:1", 40 * MiB, 700 * MiB, reserved=64 * MiB),
    ]
    assert imbalances(recs) == []
    # memory outside the pool (a raw cudaMalloc, a second context) still counts
    recs = [
        peak("cuda:0", 40 * MiB, 10 * GiB + 1700 * MiB, reserved=10 * GiB),
        peak("cuda:1", 40 * MiB, 700 * MiB, reserved=64 * MiB),
    ]
    [f] = imbalances(recs)
    assert f.device == "cuda:0" and "outside PyTorch's reserved pool" in (f.evidence or "")
