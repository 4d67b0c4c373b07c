"""op-device: the rules on an op's input and output devices (placeholders left out), and the
finding naming the op through a real worker."""

from __future__ import annotations

import textwrap

import pytest
from clirun import run_suite


@pytest.mark.parametrize(
    ("inputs", "outputs", "before", "after", "kinds"),
    [
        (["cuda:1", "cuda:1"], ["cuda:1"], 1, 1, []),
        (["cuda:1"], ["cuda:0"], 1, 1, ["wrong-device"]),
        (["cuda:1", "cpu"], ["cuda:0"], 1, 1, []),  # mixed inputs: no single device to expect
        ([], ["cuda:0"], None, None, []),  # a factory op
        (["cuda:1"], ["cuda:1"], 1, 0, ["device-state-leak"]),
        (["cuda:1"], ["cuda:0"], 1, 0, ["wrong-device", "device-state-leak"]),
    ],
)
def test_op_events_rules(inputs, outputs, before, after, kinds):
    from gpucheck.detectors.op_device import op_events

    assert [k for k, _ in op_events("ext::op", inputs, outputs, before, after)] == kinds


OP_SUITE = textwrap.dedent("""
    import torch

    @torch.library.custom_op("gpucheck_demo::good", mutates_args=())
    def good(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @torch.library.custom_op("gpucheck_demo::alloc_elsewhere", mutates_args=())
    def alloc_elsewhere(x: torch.Tensor) -> torch.Tensor:
        # stands in for at::empty(..., torch::kCUDA) landing on the current device
        return torch.empty(x.shape, device="meta")

    def test_good():
        x = torch.rand(8)
        assert torch.equal(torch.ops.gpucheck_demo.good(x), x * 2)
        (x + 1).sum()   # torch's own ops are not watched

    def test_bad():
        x = torch.rand(8)
        for _ in range(3):
            y = torch.ops.gpucheck_demo.alloc_elsewhere(x)
        assert y.shape == x.shape
""")


def test_op_device_names_the_op_through_a_real_worker(tmp_path):
    proc, recs = run_suite(tmp_path, "ops", {"test_ops.py": OP_SUITE})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert recs["test_ops.py::test_good"]["findings"] == []
    bad = recs["test_ops.py::test_bad"]
    assert bad["status"] == "passed"  # the test itself cannot see it
    [f] = bad["findings"]
    assert (f["kind"], f["severity"], f["op"]) == (
        "wrong-device",
        "error",
        "gpucheck_demo::alloc_elsewhere",
    )
    assert "(3 calls)" in f["message"] and "inputs on cpu, output(s) on meta" in f["evidence"]
    assert "x.options()" in f["hint"]


def test_placeholder_outputs_and_arguments_are_no_device_for_the_output_rule():
    """fused-ssim's evaluation path returns empty CPU tensors for the buffers it does not
    compute, and the rasterizers take them for arguments not given: the output-device rule
    judges the tensors that hold data (before, every clean call was a wrong-device error)."""
    import torch

    from gpucheck.detectors.op_device import _tensor_devices, op_events

    image = torch.empty(3, 4, 4, device="meta")
    args = (image, torch.empty(0), torch.Tensor([]))
    out = (torch.empty(1, device="meta"), torch.empty(0), torch.empty(0), torch.empty(0))
    assert _tensor_devices(args) == ["meta"] and _tensor_devices(out) == ["meta"]
    assert op_events("ext.fusedssim", _tensor_devices(args), _tensor_devices(out), 0, 0) == []
    # an output with data elsewhere is still named, placeholders among the inputs or not
    moved = (torch.empty(3, 4, 4),)
    assert [
        k for k, _ in op_events("ext.render", _tensor_devices(args), _tensor_devices(moved), 0, 0)
    ] == ["wrong-device"]
