"""memory-layout: a call made again with its tensor arguments' values in another layout, on real
calls: a CPU pybind11 extension built here with ``load_inline`` (one build for the module: a
kernel that reads its input as if contiguous, its twin that copies first, one that refuses
other layouts with TORCH_CHECK, an output argument written as if contiguous, a storage offset
ignored, a projection that leaves culled rows unwritten), ``torch.library`` ops, and the whole
path through ``gpucheck run``'s worker and its reports (the failing assert is the symptom)."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from types import SimpleNamespace

import extkit
import pytest
import torch
from clirun import gpucheck

from gpucheck.detectors import CaseInfo, layouts, op_watch
from gpucheck.detectors.base import WorkerContext
from gpucheck.detectors.memory_layout import FAMILIES, KIND, UNWRITTEN_NOTE, MemoryLayout
from gpucheck.model import results

NAME = "gpucheck_test_layout_ext"
CASE = CaseInfo("cpu", "s", "test_x.py::test_x")
SOURCE = textwrap.dedent("""
    #include <torch/extension.h>
    #include <tuple>
    static int64_t n_calls = 0;
    // the sum of each row of x [N, M], its memory read as if it were contiguous (the defect)
    at::Tensor row_sums(const at::Tensor& x) {
      ++n_calls;
      TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be [N, M] float32");
      at::Tensor out = at::empty({x.size(0)}, x.options());
      const float* p = x.data_ptr<float>();
      float* o = out.data_ptr<float>();
      const int64_t m = x.size(1);
      for (int64_t i = 0; i < x.size(0); ++i) {
        float s = 0.f;
        for (int64_t j = 0; j < m; ++j) s += p[i * m + j];
        o[i] = s;
      }
      return out;
    }
    // the fixed twin: a contiguous copy first
    at::Tensor row_sums_fixed(const at::Tensor& x) { return row_sums(x.contiguous()); }
    // the twin that refuses other layouts
    at::Tensor row_sums_checked(const at::Tensor& x) {
      TORCH_CHECK(x.is_contiguous(), "x must be contiguous, got strides ", x.strides());
      return row_sums(x);
    }
    // strides honoured, the storage offset not (the storage's first element taken as x's)
    at::Tensor row_sums_storage(const at::Tensor& x) {
      ++n_calls;
      at::Tensor out = at::empty({x.size(0)}, x.options());
      const float* p = static_cast<const float*>(x.storage().data());
      for (int64_t i = 0; i < x.size(0); ++i) {
        float s = 0.f;
        for (int64_t j = 0; j < x.size(1); ++j) s += p[i * x.stride(0) + j * x.stride(1)];
        out.data_ptr<float>()[i] = s;
      }
      return out;
    }
    // y [N, M] = 2 x, y allocated by the caller and written as if contiguous
    void double_into(const at::Tensor& x, at::Tensor& y) {
      ++n_calls;
      const at::Tensor c = x.contiguous();
      const float* p = c.data_ptr<float>();
      float* q = y.data_ptr<float>();
      for (int64_t k = 0; k < c.numel(); ++k) q[k] = 2.f * p[k];
    }
    // (points [N, 2] * 2, radius [N]): a row whose x is not positive is culled, radius 0,
    // its output row never written (here: a value that changes every call, as stale memory
    // does); `raw`: x read as if contiguous
    std::tuple<at::Tensor, at::Tensor> project_impl(const at::Tensor& x, bool raw) {
      static float stale = 1.f;
      ++n_calls;
      const at::Tensor c = raw ? x : x.contiguous();
      at::Tensor out = at::empty({c.size(0), 2}, c.options());
      at::Tensor radius = at::zeros({c.size(0)}, c.options().dtype(at::kInt));
      const float* p = c.data_ptr<float>();
      float* o = out.data_ptr<float>();
      for (int64_t i = 0; i < c.size(0); ++i) {
        if (p[2 * i] <= 0.f) {
          stale += 1.f;
          o[2 * i] = stale;
          o[2 * i + 1] = -stale;
          continue;
        }
        o[2 * i] = 2.f * p[2 * i];
        o[2 * i + 1] = 2.f * p[2 * i + 1];
        radius.data_ptr<int>()[i] = 1;
      }
      return {out, radius};
    }
    using Pair = std::tuple<at::Tensor, at::Tensor>;
    Pair project(const at::Tensor& x) { return project_impl(x, false); }
    Pair project_raw(const at::Tensor& x) { return project_impl(x, true); }
    // a kernel that faults on another layout (what an illegal address reads like from Python)
    at::Tensor faults(const at::Tensor& x) {
      ++n_calls;
      TORCH_CHECK(x.is_contiguous(), "CUDA error: an illegal memory access was encountered");
      return x.sum(1);
    }
    // row sums and a byte buffer of scratch that differs every call (byte scratch is no result)
    std::tuple<at::Tensor, at::Tensor> with_scratch(const at::Tensor& x) {
      static uint8_t k = 0;
      at::Tensor bytes = at::full({16}, ++k, x.options().dtype(at::kByte));
      return {row_sums_fixed(x), bytes};
    }
    // (alpha [H, W, 1], last [H, W]) of colors [H, W, 3] (indexed by its strides): the pixels
    // of the tiles `mask` leaves out are never written (at::empty); `raw`: colors read as if
    // contiguous
    Pair masked_alpha_impl(const at::Tensor& colors, const at::Tensor& mask, int64_t tile,
                           bool raw) {
      ++n_calls;
      const int64_t h = colors.size(0), w = colors.size(1);
      at::Tensor alpha = at::empty({h, w, 1}, colors.options());
      at::Tensor last = at::empty({h, w}, colors.options().dtype(at::kInt));
      auto c = colors.accessor<float, 3>();
      const float* flat = colors.data_ptr<float>();
      auto k = mask.accessor<bool, 2>();
      auto a = alpha.accessor<float, 3>();
      auto l = last.accessor<int, 2>();
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) {
          if (!k[y / tile][x / tile]) continue;
          const float* p = flat + (y * w + x) * 3;
          const float sum = raw ? p[0] + p[1] + p[2] : c[y][x][0] + c[y][x][1] + c[y][x][2];
          a[y][x][0] = sum / 3;
          l[y][x] = static_cast<int>(x);
        }
      return {alpha, last};
    }
    Pair masked_alpha(const at::Tensor& colors, const at::Tensor& mask, int64_t tile) {
      return masked_alpha_impl(colors, mask, tile, false);
    }
    Pair masked_alpha_raw(const at::Tensor& colors, const at::Tensor& mask, int64_t tile) {
      return masked_alpha_impl(colors, mask, tile, true);
    }
    int64_t calls() { return n_calls; }
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
      m.def("row_sums", &row_sums, py::arg("x"));
      m.def("row_sums_fixed", &row_sums_fixed, py::arg("x"));
      m.def("row_sums_checked", &row_sums_checked, py::arg("x"));
      m.def("row_sums_storage", &row_sums_storage, py::arg("x"));
      m.def("double_into", &double_into, py::arg("x"), py::arg("y"));
      m.def("project", &project);
      m.def("project_raw", &project_raw);
      m.def("faults", &faults, py::arg("x"));
      m.def("with_scratch", &with_scratch, py::arg("x"));
      m.def("masked_alpha", &masked_alpha);
      m.def("masked_alpha_raw", &masked_alpha_raw);
      m.def("calls", &calls);
    }
""")


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    """The module, built once (about 25 s) after the watch was installed."""
    return extkit.build(NAME, SOURCE, tmp_path_factory)


@pytest.fixture(autouse=True)
def fresh_budget():
    """Each test starts as a fresh worker process would: no signature re-run yet."""
    FAMILIES.clear()
    yield
    FAMILIES.clear()


def judged(body, det=None):
    """The findings of a fresh detector around ``body()``."""
    det = det or MemoryLayout()
    det.case_started(CASE)
    try:
        body()
    finally:
        found = det.case_finished(CASE)
    return found


def test_other_layouts_hold_the_same_values():
    x = torch.rand(5, 7)
    for t in (x, x.t(), torch.rand(2, 3, 4, 5), torch.rand(6, 1), torch.rand(2, 3, 4, 5)[:, :, 1]):
        other, what = layouts.other_layout(t)
        assert torch.equal(other, t) and other.is_contiguous() != t.is_contiguous()
        assert other.storage_offset() == 4 and "storage offset 4" in what
        # every element of the buffer behind it is one of the tensor's own values
        behind = other.as_strided((other.untyped_storage().nbytes() // 4,), (1,), 0)
        assert torch.isin(behind, t.reshape(-1)).all()
    assert layouts.other_layout(torch.rand(2, 3, 4, 5))[1].startswith("channels-last")
    assert layouts.other_layout(x.t())[1].startswith("contiguous")
    assert layouts.other_layout(x)[1].startswith("stored with dimensions 0 and 1 swapped")
    assert layouts.other_layout(torch.rand(6, 1))[1].startswith("every other element")
    same, what = layouts.at_offset(x.t())
    assert torch.equal(same, x.t()) and same.stride() == x.t().stride() and "offset 4" in what


def test_compare_counts_what_differs_within_the_dtypes_rounding():
    b = torch.tensor([1.0, 2.0, float("nan"), 4.0])
    o = torch.tensor([1.0, 2.0 + 1e-6, 5.0, -4.0])
    gap = layouts.compare("output 0", b, o)
    assert (gap.compared, gap.differing, gap.max_abs, gap.max_rel) == (3, 1, 8.0, 2.0)
    assert gap.mask.tolist() == [False, False, False, True]
    keep = torch.tensor([True, True, True, False])
    assert layouts.compare("output 0", b, o, keep).differing == 0
    ints = layouts.compare("output 1", torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4]))
    assert (ints.differing, ints.tolerance) == (1, 0.0)
    assert "shape [2]" in layouts.compare("x", torch.zeros(3), torch.zeros(2)).text()


def test_a_kernel_that_reads_its_input_as_if_contiguous_is_named_with_the_argument(ext):
    torch.manual_seed(0)
    x = torch.rand(5, 7)
    (f,) = judged(lambda: ext.row_sums(x))
    assert (f.kind, f.severity, f.op) == (KIND, "error", f"{NAME}.row_sums")
    assert "argument 0 (x) stored with dimensions 0 and 1 swapped" in f.message
    assert "output 0: 5 of 5 elements differ" in f.evidence
    assert "test_memory_layout.py:" in f.message  # the line that made the call
    assert "TORCH_CHECK(x.is_contiguous()" in f.hint
    # the case passed it non-contiguous: the case's own result was the wrong one
    (g,) = judged(lambda: ext.row_sums(x.t().contiguous().t()))
    assert "argument 0 (x) contiguous" in g.message
    assert "the case's call: argument 0 (x) non-contiguous (strides (1, 5))" in g.evidence


def test_the_fixed_twin_and_the_refusing_twin_draw_nothing(ext):
    x = torch.rand(5, 7)
    before = ext.calls()
    assert judged(lambda: (ext.row_sums_fixed(x), ext.row_sums_fixed(x.t()))) == []
    assert ext.calls() - before == 4  # each signature: the case's call and one re-run
    before = ext.calls()
    assert judged(lambda: ext.row_sums_checked(x)) == []
    assert ext.calls() - before == 1  # the re-run was refused before it counted


def test_a_signature_is_made_again_on_a_few_shapes_a_process_a_bug_in_every_case(ext):
    def calls(body):
        before = ext.calls()
        found = judged(body)
        return found, ext.calls() - before

    x = torch.rand(5, 7)
    # the first call of a signature is made again, once
    assert calls(lambda: [ext.row_sums_fixed(x) for _ in range(3)]) == ([], 4)
    # a later case, and another shape of the same tail pattern: not again
    assert calls(lambda: ext.row_sums_fixed(torch.rand(9, 3))) == ([], 1)
    # a shape with other tails (a multiple of 16 here: 32 × 16), or another layout: again
    assert calls(lambda: ext.row_sums_fixed(torch.rand(32, 16))) == ([], 2)
    assert calls(lambda: ext.row_sums_fixed(x.t())) == ([], 2)
    # an op found reading a layout wrongly is made again in every case, on every shape
    for shape in ((5, 7), (5, 7), (9, 3)):
        found, n = calls(lambda s=shape: ext.row_sums(torch.rand(*s)))
        assert [f.kind for f in found] == [KIND] and n >= 2


def test_an_output_argument_written_as_if_contiguous(ext):
    torch.manual_seed(0)
    x = torch.rand(4, 6)
    (f,) = judged(lambda: ext.double_into(x, torch.empty(4, 6)))
    assert "argument 1 (y) stored with dimensions 0 and 1 swapped" in f.message
    assert "argument 1 (y), written by the call: 22 of 24 elements differ" in f.evidence


def test_a_storage_offset_ignored_is_named_as_such(ext):
    (f,) = judged(lambda: ext.row_sums_storage(torch.rand(5, 7)))
    assert "argument 0 (x) in its own strides at storage offset 4" in f.message


def test_unwritten_entries_are_left_out_a_real_difference_is_not(ext):
    x = torch.rand(8, 2) - 0.3
    x[0, 0] = -1.0  # culled
    before = ext.calls()
    assert judged(lambda: ext.project(x)) == []
    # the outputs differed in the culled rows: the call was made again in its own layout,
    # and again in the other one, and the rows on which they disagree were left out
    assert ext.calls() - before == 4
    (f,) = judged(lambda: ext.project_raw(x))
    assert f"{NAME}.project_raw gives other results" in f.message
    assert "argument 0 stored with dimensions 0 and 1 swapped" in f.message  # no py::arg
    assert "made again in the case's own layout, disagreed with itself" in f.evidence


def _tiles():
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[0, 0] = mask[3, 2] = False
    return mask


def test_masked_tiles_never_written_are_no_layout_difference(ext):
    """Real ``at::empty`` outputs: the masked tiles hold what the memory held, in the case's
    call and in each re-run; case after case (the allocator reusing what the last one freed),
    nothing is reported; the same kernel reading its input as if contiguous still is."""
    colors = torch.rand(40, 48, 3)
    for _ in range(5):
        assert judged(lambda: ext.masked_alpha(colors, _tiles(), 8)) == []
        assert (
            judged(
                lambda: ext.masked_alpha(
                    colors.permute(1, 0, 2).contiguous().permute(1, 0, 2), _tiles(), 8
                )
            )
            == []
        )
    (f,) = judged(lambda: ext.masked_alpha_raw(colors, _tiles(), 8))
    assert "argument 0 stored with dimensions 1 and 2 swapped" in f.message
    assert "left out:" in f.evidence


class _Unwritten:
    """What the unwritten-output check leaves on a call for this one: its evidence, each gap
    an output's index and the mask of its elements never written (here: the culled rows)."""

    def before(self, call):
        pass

    def after(self, call, out):
        if call.op.endswith(".project"):
            culled = SimpleNamespace(index=0, mask=(out[1] == 0)[:, None].expand(-1, 2))
            call.notes[UNWRITTEN_NOTE] = SimpleNamespace(gaps=[culled])


def test_the_unwritten_output_checks_mask_is_left_out_from_the_start(ext):
    x = torch.rand(8, 2) + 0.1
    x[0, 0] = -1.0
    note = _Unwritten()
    det = MemoryLayout()
    det.case_started(CASE)
    op_watch.add(note)  # after this detector: its ``after`` runs first
    try:
        before = ext.calls()
        ext.project(x)
        assert ext.calls() - before == 2  # no difference left: no second call needed
    finally:
        op_watch.remove(note)
        assert det.case_finished(CASE) == []


def test_a_cuda_error_in_the_rerun_is_a_finding(ext):
    (f,) = judged(lambda: ext.faults(torch.rand(3, 4)))
    assert "failed with a CUDA error when given the same values in another" in f.message
    assert "illegal memory access" in f.evidence


def test_byte_scratch_is_no_result(ext):
    assert judged(lambda: ext.with_scratch(torch.rand(3, 4))) == []


def test_nothing_in_a_sanitizer_pass(ext):
    det = MemoryLayout()
    det.bind(WorkerContext(sanitizer="memcheck"))
    before = ext.calls()
    assert judged(lambda: ext.row_sums(torch.rand(5, 7)), det) == []
    assert ext.calls() - before == 1


def test_a_row_is_laid_out_as_every_other_element_and_checked_too(ext):
    torch.manual_seed(0)
    (f,) = judged(lambda: ext.row_sums(torch.rand(1, 7)))
    assert "argument 0 (x) every other element of a buffer (strides (14, 2)" in f.message


def test_one_dimensional_arguments_are_not_made_again(ext):
    before = ext.calls()
    assert judged(lambda: ext.double_into(torch.rand(6), torch.empty(6))) == []
    assert ext.calls() - before == 1


# -- torch.library ops -----------------------------------------------------------------------


def _as_if_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory read as a contiguous tensor of its shape (what a raw kernel does)."""
    return torch.as_strided(t, t.shape, layouts.contiguous_strides(t.shape), t.storage_offset())


@torch.library.custom_op("gpucheck_layout::raw_scale", mutates_args=())
def raw_scale(x: torch.Tensor, s: float) -> torch.Tensor:
    return _as_if_contiguous(x) * s


@torch.library.custom_op("gpucheck_layout::scale", mutates_args=())
def scale(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s


@torch.library.custom_op("gpucheck_layout::double_into", mutates_args=("y",))
def double_into(x: torch.Tensor, y: torch.Tensor) -> None:
    _as_if_contiguous(y).copy_(2 * x)


_NOISY_CALLS = []


@torch.library.custom_op(
    "gpucheck_layout::noisy", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,)
)
def noisy(x: torch.Tensor) -> torch.Tensor:
    _NOISY_CALLS.append(1)
    return _as_if_contiguous(x) + torch.rand_like(x)


@torch.library.custom_op("gpucheck_layout::draws", mutates_args=())
def draws(x: torch.Tensor) -> torch.Tensor:
    """Untagged, but it draws from torch's generator (a pybind11 kernel seeding curand from
    it does too)."""
    return _as_if_contiguous(x) + 0 * torch.rand_like(x)


def test_torch_library_ops_named_by_their_schema():
    x = torch.rand(2, 3, 4, 5)
    (f,) = judged(lambda: torch.ops.gpucheck_layout.raw_scale(x, 2.0))
    assert f.op == "gpucheck_layout::raw_scale"
    assert "argument 0 (x) channels-last" in f.message
    assert judged(lambda: torch.ops.gpucheck_layout.scale(x.transpose(1, 2), 2.0)) == []


def test_a_mutable_argument_of_a_schema_is_an_output_and_left_untouched():
    x, y = torch.rand(3, 4), torch.zeros(3, 4)
    (f,) = judged(lambda: torch.ops.gpucheck_layout.double_into(x, y))
    assert "argument 1 (y) stored with dimensions 0 and 1 swapped" in f.message
    assert torch.equal(y, 2 * x)  # the case's own tensor holds the case's own result


def test_random_ops_are_not_made_again():
    _NOISY_CALLS.clear()
    assert judged(lambda: torch.ops.gpucheck_layout.noisy(torch.rand(3, 4))) == []
    assert len(_NOISY_CALLS) == 1


def test_the_rerun_leaves_the_random_state_and_autograd_alone():
    x = torch.rand(3, 4, requires_grad=True)
    torch.manual_seed(3)
    torch.rand(3, 4)
    expected = torch.rand(2)
    torch.manual_seed(3)
    seen = {}

    def body():
        seen["out"] = torch.ops.gpucheck_layout.draws(x.detach())
        seen["next"] = torch.rand(2)  # as if the op had been called once

    (f,) = judged(body)
    assert f.kind == KIND and torch.equal(seen["next"], expected)
    assert x.grad is None and not seen["out"].requires_grad
    # the re-runs' deterministic mode and memory fill are torch's settings again
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory


# -- through gpucheck run's worker, with the reports --------------------------------------------

SUITE = textwrap.dedent("""
    import importlib.util, os
    import pytest, torch

    @pytest.fixture(scope="module")
    def ext():
        spec = importlib.util.spec_from_file_location(os.environ["EXT_NAME"],
                                                      os.environ["EXT_PATH"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def test_row_sums_of_a_transposed_image(ext):
        image = torch.rand(7, 5)
        sums = ext.row_sums(image.t())
        torch.testing.assert_close(sums, image.t().sum(1))

    def test_the_fixed_twin(ext):
        image = torch.rand(7, 5)
        torch.testing.assert_close(ext.row_sums_fixed(image.t()), image.t().sum(1))

    def test_the_refusing_twin(ext):
        image = torch.rand(5, 7)
        torch.testing.assert_close(ext.row_sums_checked(image), image.sum(1))
""")


def test_gpucheck_run_explains_the_failing_assert_by_the_layout(ext, tmp_path):
    suite = tmp_path / "suites" / "layout"
    suite.mkdir(parents=True)
    (suite / "test_layout.py").write_text(SUITE)
    out = tmp_path / "out"
    proc = gpucheck(
        "run",
        "--cpu-only",
        "--out",
        str(out),
        *("--format", "html", "--format", "json", "--format", "junit", "--format", "sarif"),
        cwd=tmp_path,
        timeout=300,
        env={"EXT_NAME": NAME, "EXT_PATH": ext.__file__},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = {r["case"].rsplit("::", 1)[-1]: r for r in results.cases(out / "results.jsonl")}
    bad = recs["test_row_sums_of_a_transposed_image"]
    assert bad["status"] == "failed"
    # the record keeps the worker's order: the assert, then what the detectors found
    assert [f["kind"] for f in bad["findings"]] == ["test-failure", KIND]
    layout = next(f for f in bad["findings"] if f["kind"] == KIND)
    assert "argument 0 (x) contiguous" in layout["message"]
    assert "memory-layout" in bad["cost_s"]
    for twin in ("test_the_fixed_twin", "test_the_refusing_twin"):
        assert recs[twin]["status"] == "passed" and recs[twin]["findings"] == [], twin
    # every report leads with the diagnosis and lists the assert as its symptom
    console = proc.stdout.splitlines()
    (line,) = [x for x in console if KIND in x and "explains" in x]  # the summary
    assert line.strip().startswith(f"{KIND} {NAME}.row_sums") and "1 test-failure" in line
    # the lines printed as the case's record came in: the diagnosis, then the assert
    case = [x for x in console if "test_row_sums_of_a_transposed_image" in x and ": " in x]
    assert case[0].startswith(f"{KIND}: cpu ") and case[1].startswith("test-failure: cpu ")
    doc = json.loads((out / "results.json").read_text())
    (diag,) = doc["diagnoses"]
    assert diag["kind"] == KIND and [e["kind"] for e in diag["explains"]] == ["test-failure"]
    assert doc["symptoms"] == []
    case = next(
        tc
        for tc in ET.parse(out / "junit.xml").getroot().iter("testcase")
        if tc.get("name") == "test_row_sums_of_a_transposed_image"
    )
    failure = case.find("failure")
    assert failure.get("message").startswith(f"{KIND}: {NAME}.row_sums gives other results")
    assert failure.text.index(f"{KIND}:") < failure.text.index("symptom")
    sarif = json.loads((out / "results.sarif").read_text())["runs"][0]["results"]
    assert sarif[0]["ruleId"] == KIND
    assert sarif[1]["ruleId"] == "test-failure" and sarif[1]["properties"]["explainedBy"]
