"""unwritten-output on real calls: a pybind11 extension built here on CPU (a projection that
leaves culled points unwritten with a zero radius, a rasterizer that leaves masked tiles
unwritten and its fixed twin, a kernel that writes the fill's own bits, one that writes its
argument, one that refuses a second call) and ``torch.library`` ops: the convention rule, the
two-pattern evidence, the description of the unwritten set, the names of outputs, what the
probe leaves as it was, its budget and cost, and the whole path through ``gpucheck run``."""

from __future__ import annotations

import sys
import textwrap

import extkit
import pytest
import torch

from gpucheck.detectors import op_watch, unwritten, unwritten_probe
from gpucheck.detectors.base import CaseInfo
from gpucheck.detectors.element_sets import describe
from gpucheck.detectors.unwritten_output import UnwrittenOutput

NAME = "gpucheck_test_unwritten"
SOURCE = textwrap.dedent("""
    #include <torch/extension.h>
    #include <vector>
    // a culled point (z <= 0) gets radius 0; its xy and depth are never written
    std::vector<at::Tensor> project(const at::Tensor& means) {  // [N, 3]
      auto n = means.size(0);
      auto xy = at::empty({n, 2}, means.options());
      auto depth = at::empty({n}, means.options());
      auto radii = at::empty({n}, means.options().dtype(at::kInt));
      auto m = means.accessor<float, 2>();
      auto o = xy.accessor<float, 2>();
      auto d = depth.accessor<float, 1>();
      auto r = radii.accessor<int, 1>();
      for (int64_t i = 0; i < n; ++i) {
        if (m[i][2] <= 0) { r[i] = 0; continue; }
        o[i][0] = m[i][0] / m[i][2]; o[i][1] = m[i][1] / m[i][2]; d[i] = m[i][2]; r[i] = 3;
      }
      return {xy, radii, depth};
    }
    // the pixels of masked tiles are never written (fixed: zeros), and nothing marks them
    std::vector<at::Tensor> rasterize(const at::Tensor& colors,  // [H, W, 3]
                                      const at::Tensor& mask,    // [H/tile, W/tile] bool
                                      int64_t tile, bool fixed) {
      auto h = colors.size(0), w = colors.size(1);
      auto ints = colors.options().dtype(at::kInt);
      auto alpha = fixed ? at::zeros({h, w, 1}, colors.options())
                         : at::empty({h, w, 1}, colors.options());
      auto last = fixed ? at::zeros({h, w}, ints) : at::empty({h, w}, ints);
      auto c = colors.accessor<float, 3>();
      auto a = alpha.accessor<float, 3>();
      auto l = last.accessor<int, 2>();
      auto k = mask.accessor<bool, 2>();
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) {
          if (!k[y / tile][x / tile]) continue;
          a[y][x][0] = (c[y][x][0] + c[y][x][1] + c[y][x][2]) / 3; l[y][x] = 1;
        }
      return {alpha, last};
    }
    // every element written with the bits of the probe's first fill: a value, not unwritten
    at::Tensor coincidence(const at::Tensor& x) {
      auto out = at::empty_like(x);
      out.view(at::kInt).fill_(static_cast<int32_t>(0xA5A5A5A5u));
      return out;
    }
    // adds 1 to its argument and returns it, with a count
    std::vector<at::Tensor> accumulate(at::Tensor x) {
      x.add_(1);
      auto n = at::empty({1}, x.options().dtype(at::kLong));
      n.fill_(x.numel());
      return {x, n};
    }
    // refuses to run twice in a row (state it keeps)
    at::Tensor once(const at::Tensor& x) {
      static int calls = 0;
      TORCH_CHECK(++calls % 3 == 1, "once: called again");
      return at::empty_like(x).fill_(1);
    }
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
      m.def("project", &project,
            "project(means) -> tuple[xy: Tensor, radii: Tensor, depth: Tensor]",
            py::arg("means"));
      m.def("rasterize", &rasterize,
            "rasterize(colors, mask, tile, fixed) -> tuple[alpha: Tensor, last_ids: Tensor]",
            py::arg("colors"), py::arg("mask"), py::arg("tile"), py::arg("fixed"));
      m.def("coincidence", &coincidence);
      m.def("accumulate", &accumulate);
      m.def("once", &once);
    }
""")
CASE = CaseInfo("cpu", "s", "test_x.py::test_x")


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    return extkit.build(NAME, SOURCE, tmp_path_factory)


@pytest.fixture
def det(monkeypatch):
    """The detector around one case, with this process's probe memory forgotten."""
    monkeypatch.delenv(unwritten.UNWRITTEN_ENV, raising=False)
    unwritten.MEMORY.clear()
    d = UnwrittenOutput()
    d.case_started(CASE)
    yield d
    if d.watching:
        d.case_finished(CASE)
    unwritten.MEMORY.clear()


def _means(n=8):
    means = torch.rand(n, 3) + 0.5
    means[1::3, 2] = -1.0  # culled: rows 1, 4, 7
    return means


def _mask():
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[0, 0] = mask[2, 3] = mask[4, 5] = False
    return mask


def test_rows_a_zero_radius_marks_are_the_extensions_convention(ext, det):
    _, radii, _ = ext.project(_means())
    line = sys._getframe().f_lineno - 1
    found = {f.message.split(":")[1].strip().split(" is ")[0]: f for f in det.case_finished(CASE)}
    assert set(found) == {"output 0 (xy)", "output 2 (depth)"}
    for f in found.values():
        assert (f.kind, f.severity, f.op) == ("unwritten-output", "info", f"{NAME}.project")
        assert "where output 1 (radii) is 0" in f.message and "convention" in f.message
        assert f"test_unwritten_output.py:{line}" in f.message
    assert "whole rows: 3 of 8 rows along dim 0 (1, 4, 7)" in found["output 0 (xy)"].evidence
    assert radii.tolist() == [3, 0, 3, 3, 0, 3, 3, 0]
    assert unwritten.conventions(f"{NAME}.project") == {
        0: unwritten.Convention(1, "radii", 1),
        2: unwritten.Convention(1, "radii", 1),
    }


def test_masked_tiles_left_unwritten_are_an_error_naming_the_output_and_the_tiles(ext, det):
    colors = torch.rand(40, 48, 3)
    alpha, _ = ext.rasterize(colors, _mask(), 8, False)
    found = {f.message.split(":")[1].strip(): f for f in det.case_finished(CASE)}
    alpha_f = next(f for k, f in found.items() if k.startswith("output 0 (alpha)"))
    last_f = next(f for k, f in found.items() if k.startswith("output 1 (last_ids)"))
    for f in (alpha_f, last_f):
        assert (f.kind, f.severity, f.op) == ("unwritten-output", "error", f"{NAME}.rasterize")
        assert "3 of 30 tiles of 8×8 over dims 0, 1 (40×48)" in f.message
        assert "this call: " in f.message and f"0x{unwritten_probe.PATTERNS[1]:02X}" in f.evidence
    assert "was never written at 192 of 1920 elements" in alpha_f.message
    # the values shown are those the case's own call left there
    shown = alpha_f.evidence.split("left there: ")[1].splitlines()[0].split(", ")
    assert shown == [f"{v:.3g}" for v in alpha[:8, :8].reshape(-1)[:5].tolist()]


def test_the_fixed_rasterizer_is_clean(ext, det):
    ext.rasterize(torch.rand(40, 48, 3), _mask(), 8, True)
    assert det.case_finished(CASE) == []


def test_a_value_that_equals_one_fill_pattern_is_not_unwritten(ext, det):
    out = ext.coincidence(torch.rand(16))
    assert det.case_finished(CASE) == []
    first = torch.full((4,), 0xA5A5A5A5 - (1 << 32), dtype=torch.int32)
    # one pattern alone would call these elements unwritten; both runs tell them apart
    assert bool((out.view(torch.int32) == first[0]).all())
    second = torch.full((4,), 0x5A5A5A5A, dtype=torch.int32)
    assert not unwritten_probe.unwritten(first, first).any()
    assert unwritten_probe.unwritten(first, second).all()


def test_the_probe_leaves_the_arguments_and_the_random_stream_as_the_call_left_them(ext, det):
    x = torch.zeros(4)
    torch.manual_seed(3)
    returned, n = ext.accumulate(x)
    after = torch.rand(3)
    assert returned is not None and x.tolist() == [1.0] * 4 and n.tolist() == [4]
    torch.manual_seed(3)
    assert torch.equal(torch.rand(3), after)  # the probe's re-runs drew nothing of the case's
    assert det.case_finished(CASE) == []
    assert unwritten.MEMORY.states  # it was probed


def test_a_call_that_cannot_run_again_gets_a_note_not_a_finding(ext, det):
    ext.once(torch.rand(3))
    (f,) = det.case_finished(CASE)
    assert (f.kind, f.severity) == ("detector-error", "info")
    assert f"could not re-run {NAME}.once" in f.message and "once: called again" in f.message


def test_a_torch_op_is_probed_inside_its_kernel_and_named_from_its_schema(det):
    torch.ops.gpucheck_tests.cull(_means())
    torch.ops.gpucheck_tests.tail(torch.rand(20))
    found = {f.op: f for f in det.case_finished(CASE)}
    cull = found["gpucheck_tests::cull"]
    assert cull.severity == "info" and "output 0 (xy)" in cull.message
    assert "output 1 (radii) is 0" in cull.message
    tail = found["gpucheck_tests::tail"]
    assert tail.severity == "error" and "output 0 (out)" in tail.message
    assert "a tail: the last 5 elements (from flat index 15)" in tail.message


def test_the_probe_is_unseen_by_the_cases_modes(det):
    """A case's dispatch mode (a logging mode, opcheck's checks) sees the case's call, never
    the probe's copies, re-runs and comparisons."""
    x = torch.rand(20)
    with extkit.Dispatched() as dispatched:
        torch.ops.gpucheck_tests.tail(x)
    assert dispatched.seen == ["gpucheck_tests.tail.default"]
    assert [f.severity for f in det.case_finished(CASE)] == ["error"]  # it was probed


def test_an_output_declared_unwritten_by_design_is_a_note(ext, det, monkeypatch):
    monkeypatch.setenv(unwritten.UNWRITTEN_ENV, f"{NAME}.rasterize:alpha, other::op")
    ext.rasterize(torch.rand(40, 48, 3), _mask(), 8, False)
    found = {f.message.split(":")[1].strip()[:16]: f for f in det.case_finished(CASE)}
    assert found["output 0 (alpha)"].severity == "info"
    assert "declared by design (GPUCHECK_UNWRITTEN)" in found["output 0 (alpha)"].message
    assert found["output 1 (last_i"].severity == "error"


def test_a_signature_is_probed_once_a_process_and_a_bug_again_each_case(ext, det):
    means, colors = _means(), torch.rand(40, 48, 3)
    op_watch.take_spent()
    ext.project(means)
    ext.project(means)  # the same signature: not probed again
    ext.rasterize(colors, _mask(), 8, False)
    spent = op_watch.take_spent()
    assert spent["unwritten-output"] > 0  # the probe's seconds, under its own name
    assert len([f for f in det.case_finished(CASE) if f.severity == "info"]) == 2
    det.case_started(CASE)
    ext.project(means)  # a convention: remembered, not probed again
    ext.rasterize(colors, _mask(), 8, False)  # a bug: probed again, found again
    found = det.case_finished(CASE)
    assert [f.op for f in found] == [f"{NAME}.rasterize"] * 2
    assert all(f.severity == "error" for f in found)


def test_a_few_shapes_of_a_signature_are_probed_a_process_every_shape_of_a_bug(ext, det):
    def probed(call):
        before = set(unwritten.MEMORY.states)
        call()
        return len(set(unwritten.MEMORY.states) - before)

    assert probed(lambda: ext.project(_means(8))) == 1
    # another size with the same tails (not a multiple of 16, nor of 256 elements): not probed
    assert probed(lambda: ext.project(_means(9))) == 0
    # a size without a tail along dim 0 is: tails are where a kernel's last tile is skipped
    assert probed(lambda: ext.project(_means(32))) == 1
    assert probed(lambda: ext.project(_means(256))) == 1  # 768 elements: no block's tail
    assert probed(lambda: ext.project(_means(512))) == 0  # its pattern again
    # a rasterizer found leaving tiles unwritten is probed on every new shape (this one's
    # tails are the first's)
    assert probed(lambda: ext.rasterize(torch.rand(40, 48, 3), _mask(), 8, False)) == 1
    taller = torch.ones(7, 6, dtype=torch.bool)
    taller[0, 0] = False
    assert probed(lambda: ext.rasterize(torch.rand(56, 48, 3), taller, 8, False)) == 1
    found = det.case_finished(CASE)
    assert {(f.op, f.severity) for f in found} == {
        (f"{NAME}.project", "info"),
        (f"{NAME}.rasterize", "error"),
    }


@pytest.mark.parametrize(
    ("mask", "said"),
    [
        (lambda m: m.__setitem__((slice(None), slice(None)), True), "every element"),
        (lambda m: m.__setitem__((slice(2, 4),), True), "whole rows: 2 of 6 rows along dim 0"),
        (lambda m: m.__setitem__((slice(None), slice(2, 4)), True), "whole entries of the "),
        (lambda m: m.view(-1)[-7:].fill_(True), "a tail: the last 7 elements"),
        (lambda m: m.__setitem__((0, 1, 1), True), "1 scattered elements ((0, 1, 1))"),
    ],
)
def test_the_unwritten_set_is_described_by_its_shape(mask, said):
    m = torch.zeros(6, 5, 3, dtype=torch.bool)
    mask(m)
    assert said in describe(m)


def test_tiles_are_found_over_the_two_image_dimensions_whatever_the_channels():
    m = torch.zeros(2, 40, 50, dtype=torch.bool)  # [C, H, W]
    m[:, 16:32, 32:48] = True
    assert describe(m) == "1 of 12 tiles of 16×16 over dims 1, 2 (40×50)"
    m[0, 0, 0] = True  # no longer alike in every channel, nor tiles
    assert "scattered" in describe(m)


SUITE = extkit.SUITE_LOADER + textwrap.dedent(
    """
    def _mask():
        mask = torch.ones(5, 6, dtype=torch.bool)
        mask[0, 0] = False
        return mask

    def test_projection(ext):
        means = torch.rand(8, 3) + 0.5
        means[::2, 2] = -1.0
        xy, radii, _ = ext.project(means)
        assert torch.isfinite(xy[radii > 0]).all()

    def test_masked(ext):
        alpha, _ = ext.rasterize(torch.rand(40, 48, 3), _mask(), 8, False)
        assert alpha.shape == (40, 48, 1)

    def test_fixed(ext):
        alpha, _ = ext.rasterize(torch.rand(40, 48, 3), _mask(), 8, True)
        assert float(alpha[:8, :8].abs().sum()) == 0.0
    """
)


def test_gpucheck_run_reports_the_bug_and_keeps_the_convention_clean(ext, tmp_path):
    proc, recs = extkit.run_suite(tmp_path, "unwritten", SUITE, ext)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    projection = recs["test_projection"]
    assert projection["status"] == "passed"
    assert {(f["kind"], f["severity"]) for f in projection["findings"]} == {
        ("unwritten-output", "info")
    }
    masked = recs["test_masked"]["findings"]
    assert sorted((f["kind"], f["severity"], f["message"].split(" was ")[0]) for f in masked) == [
        ("unwritten-output", "error", f"{NAME}.rasterize: output 0 (alpha)"),
        ("unwritten-output", "error", f"{NAME}.rasterize: output 1 (last_ids)"),
    ]
    assert recs["test_fixed"]["findings"] == []
    assert recs["test_masked"]["cost_s"]["unwritten-output"] > 0
