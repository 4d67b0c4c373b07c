"""What the memory detectors' tests share: the OOM messages recorded on an H200
(tests/fixtures/oom/, README there), and case records as the worker writes them (a case
that raised a message, a passed case of a given size), read back as the controller does."""

from __future__ import annotations

from pathlib import Path

from gpucheck.model.results import CaseRecord

OOM = Path(__file__).parent / "fixtures" / "oom"
GiB, MiB = 1 << 30, 1 << 20


def recorded(kind: str) -> str:
    return (OOM / f"{kind}.txt").read_text()


def failed(
    message: str,
    memory: dict | None = None,
    device: str = "cuda:0",
    case: str = "test_m.py::test_m[cuda0]",
    traceback: str = "",
) -> CaseRecord:
    """A case record as the worker writes it for a case that raised ``message``, read back."""
    head = message.splitlines()[0]
    return read_back(
        {
            "record": "case",
            "device": device,
            "suite": "s",
            "case": case,
            "mode": "blocking+nvml",
            "status": "failed",
            "memory": memory or {"torch_peak_allocated": 300 * MiB},
            "findings": [
                {
                    "kind": "test-failure",
                    "severity": "error",
                    "message": head,
                    "evidence": f"{traceback}\nE   {message}\n\ntest_m.py:12: {head.split(':')[0]}",
                }
            ],
        }
    )


def read_back(record: dict) -> CaseRecord:
    """A record as the controller reads it back from results.jsonl."""
    found = CaseRecord.from_json({"run_id": "r", **record})
    assert found is not None
    return found


# torch 2.0's wording (c10/cuda/CUDACachingAllocator.cpp of v2.0.0), as users paste it
TORCH20_OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 52.32 GiB (GPU 0; "
    "23.68 GiB total capacity; 2.10 GiB already allocated; 20.87 GiB free; 2.14 GiB reserved "
    "in total by PyTorch) If reserved memory is >> allocated memory try setting "
    "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
    "PYTORCH_CUDA_ALLOC_CONF"
)


def sized(n: int, peak: int, device: str = "cuda:0", name: str = "test_g") -> CaseRecord:
    dev = device.replace(":", "")
    return read_back(
        {
            "record": "case",
            "device": device,
            "suite": "s",
            "mode": "blocking+nvml",
            "case": f"test_g.py::{name}[{dev}-{n}]",
            "status": "passed",
            "memory": {"torch_peak_allocated": peak},
            "findings": [],
        }
    )
