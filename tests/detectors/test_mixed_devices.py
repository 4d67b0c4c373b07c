"""mixed-devices: the rule on tensors of several devices (CPU, meta, and stand-ins for two
GPUs), argument names from op schemas and signatures, the finding and its hints, and a torch
op called with a CPU tensor among others through op_watch."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest
import torch

from gpucheck.detectors import CaseInfo, MixedDevices, worker_detectors
from gpucheck.detectors import mixed_devices as md
from gpucheck.model.results import mixed_devices_hint

CASE = CaseInfo("cuda:0", "s", "test_x.py::test_x[cuda0]")


@dataclass
class _Dev:
    type: str
    index: int | None = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


class _T:
    """A stand-in for a tensor on a device this machine does not have (cuda:1)."""

    def __init__(self, device: str, shape=(4,), floating=True):
        kind, _, index = device.partition(":")
        self.device = _Dev(kind, int(index) if index else None)
        self.shape = shape
        self.dtype = "torch.float32" if floating else "torch.int64"
        self.floating = floating

    def dim(self):
        return len(self.shape)

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def is_floating_point(self):
        return self.floating

    def is_complex(self):
        return False


def test_the_rule():
    cuda0, cuda1 = _T("cuda:0"), _T("cuda:1")
    assert md.mixed([("argument 0", cuda0), ("argument 1", _T("cuda:0"))]) == []
    two = md.mixed([("argument 0 (a)", cuda0), ("argument 1 (b)", cuda1)])
    assert [d for _, d, _, _ in two] == ["cuda:0", "cuda:1"]
    cpu = md.mixed([("argument 0 (x)", cuda0), ("argument 1 (bg)", _T("cpu", (3,)))])
    assert md.describe(cpu) == "argument 1 (bg) on cpu; argument 0 (x) on cuda:0"
    # what torch lets a CUDA op take from the host: a 0-dim scalar, a small integer tensor
    assert md.mixed([("a", cuda0), ("s", _T("cpu", ()))]) == []
    assert md.mixed([("a", cuda0), ("size", _T("cpu", (2,), floating=False))]) == []
    assert md.mixed([("a", cuda0), ("ids", _T("cpu", (100,), floating=False))]) != []
    assert md.mixed([("a", cuda0), ("one", _T("cpu", (1,)))]) != []  # float data, one element
    assert md.mixed([("a", _T("cpu")), ("b", _T("cpu", (9,)))]) == []  # all on the CPU


def test_hints_say_what_to_move_where():
    cpu = md.mixed(
        [
            ("argument 0 (x)", _T("cuda:0")),
            ("argument 1 (bg)", _T("cpu", (3,))),
            ("argument 2 (y)", _T("cuda:0")),
        ]
    )
    hint = md.hint(cpu)
    assert "pass argument 1 (bg) on cuda:0" in hint and "host pointer" in hint
    two = md.mixed(
        [
            ("argument 0 (a)", _T("cuda:0")),
            ("argument 1 (b)", _T("cuda:1")),
            ("argument 2 (c)", _T("cuda:1")),
        ]
    )
    assert "pass argument 0 (a) on cuda:1" in md.hint(two) and "NVLink" in md.hint(two)


@torch.library.custom_op("gpucheck_mixed_test::blend", mutates_args=())
def blend(image: torch.Tensor, background: torch.Tensor) -> torch.Tensor:
    return image + background


@blend.register_fake
def _(image, background):
    return torch.empty_like(image)


def test_a_torch_op_with_a_cpu_tensor_among_others_is_named_before_it_runs():
    det = MixedDevices()
    persisted = []
    det.persist = persisted.append
    det.case_started(CASE)
    image = torch.empty(2, 3, device="meta")
    for args, kwargs in (
        ((image, torch.rand(3)), {}),
        ((image,), {"background": torch.rand(3)}),
        ((image, torch.empty(3, device="meta")), {}),
    ):  # the last is fine
        with contextlib.suppress(RuntimeError):  # meta + CPU may not dispatch: judged before
            torch.ops.gpucheck_mixed_test.blend(*args, **kwargs)
    (f,) = det.case_finished(CASE)
    assert "(2 calls)" in f.message
    assert (f.kind, f.severity, f.op, f.device, f.case) == (
        "mixed-devices",
        "error",
        "gpucheck_mixed_test::blend",
        "cuda:0",
        CASE.case,
    )
    assert "argument 1 (background) on cpu; argument 0 (image) on meta" in f.message
    assert "called from" in f.message and "test_mixed_devices.py:" in f.message
    assert persisted and persisted[0][0].op == "gpucheck_mixed_test::blend"
    assert mixed_devices_hint(f).startswith(
        "the CUDA error follows a call of gpucheck_mixed_test::blend with tensors on "
        "different devices"
    )
    assert "argument 1 (background) on cpu" in mixed_devices_hint(f)


@torch.library.custom_op("gpucheck_mixed_test::checked", mutates_args=())
def checked(image: torch.Tensor, background: torch.Tensor) -> torch.Tensor:
    raise ValueError("background must be on the device of image, got cpu")


@checked.register_fake
def _(image, background):  # meta + CPU dispatches here; float64 stands for "no check, faults"
    if background.dtype == torch.float64:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    raise ValueError("background must be on the device of image, got cpu")


def test_a_call_the_extension_refuses_itself_is_fine_a_fault_is_not():
    det = MixedDevices()
    persisted = []
    det.persist = persisted.append
    det.case_started(CASE)
    image = torch.empty(2, 3, device="meta")
    with pytest.raises(ValueError, match="must be on the device"):  # its own check: fine
        torch.ops.gpucheck_mixed_test.checked(image, torch.rand(3))
    assert persisted[-1] == []  # withdrawn once the call refused it
    with pytest.raises(RuntimeError, match="illegal memory access"):
        torch.ops.gpucheck_mixed_test.checked(image, torch.rand(3, dtype=torch.float64))
    (f,) = det.case_finished(CASE)
    assert (f.kind, f.op) == ("mixed-devices", "gpucheck_mixed_test::checked")
    assert [len(p) for p in persisted] == [1, 0, 1]


def test_argument_names_and_labels():
    assert md.argument_names(torch.ops.gpucheck_mixed_test.blend) == ["image", "background"]
    assert md.argument_names(torch.ops.gpucheck_mixed_test.blend.default) == ["image", "background"]

    def py(x, bg, *, gain=1.0):
        return x

    assert md.argument_names(py) == ["x", "bg", "gain"]

    class Pybind:  # what a pybind11 function's __doc__ starts with
        __doc__ = (
            "rasterize(means: torch.Tensor, colors: typing.Optional[torch.Tensor], "
            "bg: torch.Tensor = None, arg3: int = 3) -> tuple[torch.Tensor, int]\n\n"
        )

        def __call__(self):
            return None

    assert md.argument_names(Pybind()) == ["means", "colors", "bg", ""]
    x, y = torch.rand(2), torch.rand(3)
    labels = [label for label, _ in md.labelled_tensors((x, [y, x]), {"bg": y}, ["means"])]
    assert labels == ["argument 0 (means)", "argument 1[0]", "argument 1[1]", "argument bg"]


def test_it_runs_in_every_worker():
    assert "mixed-devices" in [d.name for d in worker_detectors()]


def test_zero_element_tensors_are_placeholders_not_data():
    """The rasterizers' "not given": ``torch.Tensor([])`` / ``torch.empty(0)`` on the CPU for
    an optional argument, tested with ``.size(0)`` in C++. A clean call draws nothing; a real
    CPU background beside two placeholders is named alone."""
    cuda0 = _T("cuda:0", (5000, 3))
    placeholders = [
        ("argument 2 (cov3D_precomp)", _T("cpu", (0,))),
        ("argument 3 (colors_precomp)", _T("cpu", (0, 3))),
    ]
    assert md.mixed([("argument 0 (means3D)", cuda0), *placeholders]) == []
    found = md.mixed(
        [("argument 0 (means3D)", cuda0), *placeholders, ("argument 4 (bg)", _T("cpu", (3,)))]
    )
    assert md.describe(found) == "argument 4 (bg) on cpu; argument 0 (means3D) on cuda:0"
    assert "cov3D" not in md.hint(found) and "colors_precomp" not in md.hint(found)


def test_a_call_with_placeholders_draws_no_finding_through_the_watch():
    det = MixedDevices()
    det.case_started(CASE)
    image = torch.empty(2, 3, device="meta")
    with contextlib.suppress(RuntimeError):
        torch.ops.gpucheck_mixed_test.blend(image, torch.empty(0))
    with contextlib.suppress(RuntimeError):
        torch.ops.gpucheck_mixed_test.blend(image, torch.Tensor([]))
    assert det.case_finished(CASE) == []
