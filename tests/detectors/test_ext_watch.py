"""The watch of compiled extension modules (ext_watch) on a real pybind11 module built here
with ``torch.utils.cpp_extension.load_inline`` (C++ only: it links libc10 / libtorch like a
CUDA extension does): found by its ELF, its functions wrapped at load, their calls reaching
op_watch's listeners under ``module.function`` with the Python line that made them (forward
and autograd's backward of an ``autograd.Function``), a module loaded during a case, the
opt-outs, mixed-device arguments, and the whole path through ``gpucheck run``'s worker."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
import types

import extkit
import pytest
import torch

from gpucheck.detectors import CaseInfo, MixedDevices, elf, ext_watch, op_watch
from gpucheck.detectors.op_device import OpDevice

NAME = "gpucheck_test_ext"
LATE = "gpucheck_test_ext_late"  # a second module in the same library, loaded mid-case
SOURCE = textwrap.dedent(f"""
    #include <torch/extension.h>
    #include <vector>
    at::Tensor scale(const at::Tensor& x, double s) {{ return x * s; }}
    at::Tensor blend(const at::Tensor& x, const at::Tensor& bg) {{ return x + bg; }}
    int64_t count(const std::vector<at::Tensor>& xs) {{ return xs.size(); }}
    // the output on another device than the input (an allocation with the wrong options)
    at::Tensor moved(const at::Tensor& x) {{
      return at::empty(x.sizes(), x.options().device(at::kMeta));
    }}
    // a rasterizer's entry point that checks nothing: bg's pointer goes to the "kernel"
    at::Tensor render(const at::Tensor& x, const at::Tensor& bg) {{
      (void)bg.data_ptr();
      return at::empty_like(x);
    }}
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{
      m.def("scale", &scale, py::arg("x"), py::arg("s"));
      m.def("blend", &blend, py::arg("x"), py::arg("bg"));
      m.def("count", &count);
      m.def("moved", &moved);
      m.def("render", &render, py::arg("x"), py::arg("bg"));
      auto nested = m.def_submodule("nested");
      nested.def("scale", &scale, py::arg("x"), py::arg("s"));
    }}
    PYBIND11_MODULE({LATE}, m) {{
      m.def("scale", &scale, py::arg("x"), py::arg("s"));
    }}
""")
CASE = CaseInfo("cpu", "s", "test_x.py::test_x")


@pytest.fixture(scope="session")
def ext(tmp_path_factory):
    """The module, built once per session (about 25 s) after the watch was installed."""
    return extkit.build(NAME, SOURCE, tmp_path_factory)


class Log:
    def __init__(self):
        self.calls = []

    def before(self, call):
        self.calls.append(call)

    def after(self, call, out):
        pass


@pytest.fixture
def log():
    listener = Log()
    assert op_watch.add(listener)
    yield listener
    assert op_watch.remove(listener) is None
    ext_watch.set_unwatched()


def _load_late(path):
    """What ``cpp_extension.load()`` does to import a built module (never in sys.modules)."""
    spec = importlib.util.spec_from_file_location(LATE, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_torch_extension_is_told_by_its_elf(ext):
    assert {"libc10.so"} <= set(elf.needed(ext.__file__)) and elf.links_torch(ext.__file__)
    assert ext_watch.is_torch_extension(ext)
    assert not ext_watch.is_torch_extension(torch._C)  # torch's own
    import _json  # a compiled module that does not link torch (when it is a file at all)

    assert not ext_watch.is_torch_extension(_json)
    assert not ext_watch.is_torch_extension(types.ModuleType("plain"))
    assert not elf.links_torch(sys.executable + ".does-not-exist")


def test_its_functions_and_submodules_are_wrapped_at_load(ext):
    (record,) = [r for r in ext_watch.watched_modules() if r.name == NAME]
    assert record.path == os.path.realpath(ext.__file__)
    assert set(record.functions) == {
        f"{NAME}.scale",
        f"{NAME}.blend",
        f"{NAME}.count",
        f"{NAME}.moved",
        f"{NAME}.render",
        f"{NAME}.nested.scale",
    }
    for fn in (ext.scale, ext.blend, ext.nested.scale):
        assert isinstance(getattr(fn, op_watch.ORIGINAL), types.BuiltinFunctionType)
    assert ext.scale.__name__ == "scale" and "bg" in ext.blend.__doc__
    assert NAME not in sys.modules  # load_inline never puts it there: the import hook did it


def test_calls_reach_listeners_named_with_their_line(ext, log):
    x = torch.rand(5)
    from_name = ext.scale  # a reference taken after the load is the wrapper too
    torch.testing.assert_close(from_name(x, 2.0), x * 2)
    line = sys._getframe().f_lineno - 1
    ext.nested.scale(x, s=3.0)
    (first, nested) = log.calls
    assert first.op == f"{NAME}.scale" and first.args == (x, 2.0) and first.autograd is None
    assert first.frame.endswith(
        f"test_ext_watch.py:{line} in test_calls_reach_listeners_named_with_their_line"
    )
    assert nested.op == f"{NAME}.nested.scale" and nested.kwargs == {"s": 3.0}


class Scale(torch.autograd.Function):
    """How the 3DGS rasterizers call their ``_C``: forward and backward in Python."""

    @staticmethod
    def forward(ctx, ext, x):
        ctx.ext = ext
        return ext.scale(x, 2.0)

    @staticmethod
    def backward(ctx, grad):
        return None, ctx.ext.scale(grad, 2.0)


def test_forward_and_the_backward_autograd_calls_are_watched(ext, log):
    x = torch.rand(4, requires_grad=True)
    Scale.apply(ext, x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 2.0))
    assert [(c.op, c.autograd) for c in log.calls] == [
        (f"{NAME}.scale", "forward"),
        (f"{NAME}.scale", "backward"),
    ]
    assert log.calls[0].frame.endswith("in Scale.forward")
    assert log.calls[1].frame.endswith("in Scale.backward")
    assert log.calls[1].thread != log.calls[0].thread or log.calls[1].args[0].shape == (4,)


def test_a_module_loaded_during_a_case_is_watched(ext, log):
    late = _load_late(ext.__file__)
    assert late is not ext and late.__name__ == LATE
    late.scale(torch.rand(2), 1.0)
    assert [c.op for c in log.calls] == [f"{LATE}.scale"]


def test_watch_call_does_not_watch_a_wrapped_function_twice(ext, log):
    op_watch.watch_call("my_ext.scale", ext.scale, torch.rand(2), 2.0)
    assert [c.op for c in log.calls] == ["my_ext.scale"]


def test_opted_out_modules_and_functions_are_not_watched(ext, log, monkeypatch):
    x = torch.rand(3)
    ext_watch.set_unwatched([NAME])
    ext.scale(x, 1.0)
    ext.nested.scale(x, 1.0)
    ext_watch.set_unwatched([f"{NAME}.scale"])
    ext.scale(x, 1.0)
    ext.blend(x, x)
    monkeypatch.setenv(ext_watch.UNWATCHED_ENV, f" {NAME}.blend , other._C")
    ext_watch.set_unwatched()
    ext.blend(x, x)
    ext.scale(x, 1.0)
    assert [c.op for c in log.calls] == [f"{NAME}.blend", f"{NAME}.scale"]
    assert ext_watch.unwatched("other._C.fn") and not ext_watch.unwatched("other._Cx")


def test_no_listener_no_watch(ext):
    seen = []
    original = op_watch.watched
    try:
        op_watch.watched = lambda *a: seen.append(a)  # type: ignore[assignment]
        torch.testing.assert_close(ext.scale(torch.ones(2), 3.0), torch.full((2,), 3.0))
    finally:
        op_watch.watched = original
    assert seen == []


def test_mixed_devices_name_the_arguments_of_a_pybind_function_before_it_runs(ext):
    det = MixedDevices()
    persisted = []
    det.persist = persisted.append
    det.case_started(CASE)
    x = torch.empty(4, 3, device="meta")
    bg = torch.tensor([0.1, 0.2, 0.3])  # the background colour left on the CPU
    ext.render(x, bg)  # no check in the extension: the host pointer goes to its kernel
    line = sys._getframe().f_lineno - 1
    ext.render(x, torch.tensor(0.5))  # a 0-dim CPU scalar: fine
    ext.count([x, torch.tensor([1, 2])])  # a small integer CPU tensor (a size): fine
    with pytest.raises(RuntimeError, match="not on the expected device"):
        ext.blend(x, bg)  # refused by the extension itself (torch's check): fine
    (f,) = det.case_finished(CASE)
    assert (f.kind, f.severity, f.op) == ("mixed-devices", "error", f"{NAME}.render")
    assert "argument 1 (bg) on cpu; argument 0 (x) on meta" in f.message
    assert f"test_ext_watch.py:{line} in test_mixed_devices_name" in f.message
    assert (
        f.hint.startswith(
            "argument 1 (bg) on cpu; argument 0 (x) on meta: pass argument 1 (bg) on meta"
        )
        and "not the extension's device guard" in f.hint
    )
    assert "argument 1 (bg): cpu, shape [3], float32" in f.evidence
    # each finding was written out before its call ran; the refused call's was withdrawn
    assert [[g.op for g in p] for p in persisted] == [
        [f"{NAME}.render"],
        [f"{NAME}.blend", f"{NAME}.render"],
        [f"{NAME}.render"],
    ]


def test_op_device_names_a_pybind_function_and_its_line(ext):
    det = OpDevice()
    det.case_started(CASE)
    ext.moved(torch.rand(3))
    line = sys._getframe().f_lineno - 1
    ext.blend(torch.rand(3), torch.rand(3))  # right: the output on the inputs' device
    (f,) = det.case_finished(CASE)
    assert (f.kind, f.op) == ("wrong-device", f"{NAME}.moved")
    assert "inputs on cpu, output(s) on meta" in f.evidence
    assert f"test_ext_watch.py:{line} in test_op_device_names_a_pybind_function" in f.evidence


SUITE = extkit.SUITE_LOADER + textwrap.dedent(
    '''
    def test_background_on_the_cpu(ext):
        x = torch.empty(4, 3, device="meta")
        ext.render(x, torch.tensor([0.1, 0.2, 0.3]))

    @torch.library.custom_op("gpucheck_mixed::faults", mutates_args=())
    def faults(x: torch.Tensor, bg: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    @faults.register_fake
    def _(x, bg):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def test_fault_after_a_cpu_argument():
        torch.ops.gpucheck_mixed.faults(torch.empty(2, 3, device="meta"), torch.rand(3))

    @pytest.mark.gpucheck_unwatched("'''
    + NAME
    + """")
    def test_opted_out(ext):
        ext.render(torch.empty(4, 3, device="meta"), torch.tensor([0.1, 0.2, 0.3]))

    def test_dies_after_a_cpu_argument(ext):
        if os.environ.get("DEMO_ABORT"):
            ext.render(torch.empty(4, 3, device="meta"), torch.tensor([0.1, 0.2, 0.3]))
            os.abort()  # what a kernel given a host pointer may do to the process
"""
)


def test_gpucheck_run_records_mixed_devices_and_names_the_argument_in_the_hint(ext, tmp_path):
    proc, recs = extkit.run_suite(tmp_path, "mixed", SUITE, ext, DEMO_ABORT="1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (mixed,) = [
        f for f in recs["test_background_on_the_cpu"]["findings"] if f["kind"] == "mixed-devices"
    ]
    assert mixed["op"] == f"{NAME}.render" and "argument 1 (bg) on cpu" in mixed["message"]
    assert "test_mixed.py:" in mixed["message"]
    fault = recs["test_fault_after_a_cpu_argument"]
    kinds = {f["kind"]: f for f in fault["findings"]}
    assert set(kinds) == {"mixed-devices", "cuda-error"}
    assert "argument 1 (bg) on cpu" in kinds["cuda-error"]["hint"]
    assert "OptionalCUDAGuard" not in kinds["cuda-error"]["hint"]
    assert "mixed-devices" not in {f["kind"] for f in recs["test_opted_out"]["findings"]}
    assert recs["test_dies_after_a_cpu_argument"]["status"] == "crashed"
    # the finding made before the call outlives the crash in the worker's state file
    pending = [
        f
        for state in (tmp_path / "out" / "workers").glob("*.state.json")
        for f in json.loads(state.read_text()).get("pending_findings") or []
    ]
    assert [(f["kind"], f["op"]) for f in pending] == [("mixed-devices", f"{NAME}.render")]
    # ... and the harness puts it into the crash record, whose hint names the argument
    died = {f["kind"]: f for f in recs["test_dies_after_a_cpu_argument"]["findings"]}
    assert set(died) == {"mixed-devices", "crash"}
    assert died["mixed-devices"]["op"] == f"{NAME}.render"
    assert "argument 1 (bg) on cpu" in died["crash"]["hint"]


class _FakeDevice:
    index = 0


def test_a_window_opened_in_an_autograd_forward_stays_open_for_its_backward(ext, monkeypatch):
    """A pybind function's outputs get their grad_fn only when ``apply`` returns: the window
    opened at its forward call stays open, and autograd's backward call is logged in it. (The
    profiler and the markers are replaced here: no GPU.)"""
    from gpucheck.detectors import launch_trace as lt

    trace = lt.LaunchTrace()
    closed = []
    monkeypatch.setattr(op_watch, "input_device", lambda call: _FakeDevice())

    def open_():
        trace.open, trace.window = True, lt.Window()
        return True

    monkeypatch.setattr(trace, "_open", open_)
    monkeypatch.setattr(trace, "_mark", lambda entry: trace.window.log.append(entry))

    def close():
        if trace.open:
            trace.open = False
            closed.append(list(trace.window.log))

    monkeypatch.setattr(trace, "_close", close)
    trace.acquire()
    try:
        x = torch.rand(4, requires_grad=True)
        y = Scale.apply(ext, x)
        assert trace.open  # its backward is still to come
        y.sum().backward()
        assert not trace.open
        ext.scale(torch.rand(2), 1.0)  # no grad: opens and closes at once
    finally:
        trace.finish()
    first, second = closed
    assert [(e["edge"], e["op"], e["frame"].rsplit(" in ", 1)[1]) for e in first] == [
        ("begin", f"{NAME}.scale", "Scale.forward"),
        ("end", f"{NAME}.scale", "Scale.forward"),
        ("begin", f"{NAME}.scale", "Scale.backward"),
        ("end", f"{NAME}.scale", "Scale.backward"),
    ]
    assert [e["edge"] for e in second] == ["begin", "end"]


class _FakeRecorder:
    """The callback recorder's calls, counted (no CUPTI here)."""

    def __init__(self):
        self.calls: list[str] = []
        self.seq = 0

    def open(self):
        self.calls.append("open")
        return 0

    def close(self):
        self.calls.append("close")
        return 0

    def mark(self):
        self.seq += 1
        return self.seq

    def take(self):
        return []


def test_a_profiler_of_the_tests_closes_an_open_callback_window_first(ext, monkeypatch):
    """CUPTI takes one subscriber: kineto, started beside an open callback window, would give
    the test's profiler (and every later one) no GPU events. A window kept open for a
    backward is closed, with what it recorded, before the profiler prepares, and nothing is
    closed twice. (On a GPU the backward's calls come from autograd's threads and go
    untraced; here, on the CPU, it runs on the main thread and opens a window of its own.)"""
    from gpucheck.detectors import launch_callbacks
    from gpucheck.detectors import launch_trace as lt

    rec = _FakeRecorder()
    monkeypatch.setattr(launch_callbacks, "recorder", lambda: rec)
    monkeypatch.setattr(op_watch, "input_device", lambda call: _FakeDevice())
    trace = lt.LaunchTrace()
    monkeypatch.setattr(trace, "_mark", lambda entry: trace.window.log.append(entry))
    trace.acquire()
    try:
        x = torch.rand(4, requires_grad=True)
        y = Scale.apply(ext, x)
        assert trace.open and trace.callbacks is rec and lt._holder is trace
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            z = y * 2
        assert not trace.open and lt._holder is None and rec.calls == ["open", "close"]
        assert any(e.name == "aten::mul" for e in prof.events())  # the test's profiler ran
        z.sum().backward()
    finally:
        windows = trace.finish()
    assert rec.calls == ["open", "close", "open", "close"]
    first, second = windows
    assert [(e["edge"], e["frame"].rsplit(" in ", 1)[1]) for e in first.log] == [
        ("begin", "Scale.forward"),
        ("end", "Scale.forward"),
    ]
    assert [e["frame"].rsplit(" in ", 1)[1] for e in second.log] == ["Scale.backward"] * 2
    assert first.recorder == second.recorder == "callbacks"


def test_an_unclaimed_kernel_is_found_in_its_library(ext):
    """The library lookup on a real extension: a kernel named like a function of the built
    module (its host symbol) is that module's; torch's is nobody's; the judgement names it."""
    from gpucheck.detectors.launch_windows import Window
    from gpucheck.detectors.wrong_stream import unclaimed_findings

    kernel = "blend(at::Tensor const&, at::Tensor const&)"  # the profiler's form
    located, unwatched = ext_watch.locate([kernel, "void at::native::add_kernel<float>(int)"])
    assert located[kernel] == os.path.realpath(ext.__file__)
    assert located["void at::native::add_kernel<float>(int)"] is None and unwatched == []
    events = [
        {
            "name": "at::cuda::(anonymous namespace)::spin_kernel(long)",
            "type": "kernel",
            "device": 0,
            "stream": s,
            "correlation": c,
        }
        for s, c in ((7, 1), (13, 2), (13, 4))
    ]
    events.insert(
        2, {"name": "void k(float*)", "type": "kernel", "device": 0, "stream": 13, "correlation": 3}
    )
    events.append(
        {"name": kernel, "type": "kernel", "device": 0, "stream": 29, "correlation": 9}
    )  # a private stream, after the call
    log = [
        {"edge": "legacy", "call": -1, "op": "", "device": 0},
        {"edge": "begin", "call": 0, "op": f"{NAME}.scale", "device": 0},
        {"edge": "end", "call": 0, "op": f"{NAME}.scale", "device": 0},
    ]
    (f,) = unclaimed_findings(CASE, [Window(events, log, {}, located)])
    assert (f.kind, f.severity, f.kernel, f.op) == ("wrong-stream", "error", kernel, None)
    assert f"of {os.path.basename(ext.__file__)} ran on cuda:0 on stream 29" in f.message
    ext_watch.set_unwatched([NAME, LATE])  # every module of that library (LATE: loaded above)
    try:
        _, unwatched = ext_watch.locate([kernel])
    finally:
        ext_watch.set_unwatched()
    assert unwatched == [os.path.realpath(ext.__file__)]
    assert unclaimed_findings(CASE, [Window(events, log, {}, located, unwatched)]) == []


def test_the_marker_opts_out_for_its_test_and_a_bad_one_is_a_usage_error(pytester):
    pytester.makepyfile(
        test_a="""
        import pytest
        from gpucheck.detectors import ext_watch

        @pytest.mark.gpucheck_unwatched("pkg._C", "other._C.fn")
        def test_marked():
            assert ext_watch.unwatched("pkg._C.rasterize") and ext_watch.unwatched("other._C.fn")
            assert not ext_watch.unwatched("other._C.gn")

        def test_unmarked():
            assert not ext_watch.unwatched("pkg._C.rasterize")
    """
    )
    pytester.runpytest("--strict-markers", "test_a.py").assert_outcomes(passed=2)
    assert ext_watch.installed()
    pytester.makepyfile(
        test_b="""
        import pytest

        @pytest.mark.gpucheck_unwatched()
        def test_bad():
            pass
    """
    )
    result = pytester.runpytest("test_b.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*gpucheck_unwatched(...) takes the names of compiled*"])
