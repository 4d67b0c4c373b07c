"""The launch trace's callback recorder (gpucheck/detectors/launch_callbacks.py and .cpp): where
it finds CUPTI, its library built and loaded for real on this machine (no GPU: CUPTI refuses
to start, and nothing is held), the opt-out, and a window it records judged as a profiler
window is (its streams are handles)."""

from __future__ import annotations

import ctypes.util
import threading

import pytest

from gpucheck._csrc import toolchain
from gpucheck.detectors import launch_callbacks as lc
from gpucheck.detectors import launch_trace as lt
from gpucheck.detectors import launch_windows as lw


def _tree(root, include: str, lib: str):
    (root / include).mkdir(parents=True)
    (root / include / "cupti.h").write_text("")
    (root / lib).mkdir(parents=True)
    (root / lib / "libcupti.so.13").write_text("")


def test_cupti_is_found_in_a_toolkit_or_a_pip_package(tmp_path):
    home = tmp_path / "cuda"
    _tree(home / "extras" / "CUPTI", "include", "lib64")
    assert lc.cupti_paths(home, search=[]) == (
        home / "extras" / "CUPTI" / "include",
        home / "extras" / "CUPTI" / "lib64",
    )
    site = tmp_path / "site"
    _tree(site / "nvidia" / "cu13", "include", "lib")
    assert lc.cupti_paths(None, search=[str(site)]) == (
        site / "nvidia" / "cu13" / "include",
        site / "nvidia" / "cu13" / "lib",
    )
    headers_only = tmp_path / "half"
    (headers_only / "include").mkdir(parents=True)
    (headers_only / "include" / "cupti.h").write_text("")
    assert lc.cupti_paths(headers_only, search=[]) is None
    assert lc.cupti_paths(None, search=[]) is None


@pytest.fixture
def fresh_recorder(monkeypatch, tmp_path):
    monkeypatch.setenv(toolchain.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(lc.BACKEND_ENV, "callbacks")
    lc.recorder.cache_clear()
    yield
    lc.recorder.cache_clear()


def test_kineto_when_asked_for(fresh_recorder, monkeypatch):
    """GPUCHECK_LAUNCH_TRACE=kineto keeps kineto's windows; a value that names no recorder
    does too, and says so."""
    for value, why in (
        ("kineto", "GPUCHECK_LAUNCH_TRACE=kineto"),
        (" Kineto ", "GPUCHECK_LAUNCH_TRACE=kineto"),
        ("yes", "GPUCHECK_LAUNCH_TRACE=yes is not one of callbacks, kineto: kineto"),
    ):
        monkeypatch.setenv(lc.BACKEND_ENV, value)
        lc.recorder.cache_clear()
        assert lc.recorder() is None
        assert lc.why_not == why


def test_the_callback_recorder_is_the_default(fresh_recorder, monkeypatch):
    """Unset or empty, the trace asks for the callback recorder: the build is tried (here
    against a toolkit without CUPTI, so why_not names the build, not the setting)."""
    monkeypatch.setattr(lc, "cupti_paths", lambda home, search=None: None)
    for value in (None, "", "callbacks"):
        if value is None:
            monkeypatch.delenv(lc.BACKEND_ENV, raising=False)
        else:
            monkeypatch.setenv(lc.BACKEND_ENV, value)
        lc.recorder.cache_clear()
        assert lc.recorder() is None
        assert lc.why_not.startswith("FileNotFoundError: no CUDA toolkit with CUPTI"), lc.why_not


def test_the_library_builds_and_opens_only_with_a_driver(fresh_recorder):
    """Built and loaded for real. Without a CUDA driver (CI) CUPTI does not start and the
    recorder holds nothing; with one, it opens and lets CUPTI go again."""
    if lc.cupti_paths(toolchain.cuda_home()) is None:
        pytest.skip("no CUDA toolkit with CUPTI on this machine")
    rec = lc.recorder()
    assert rec is not None, lc.why_not
    assert any(toolchain.cache_dir().rglob(lc.LIBRARY))
    first = rec.mark()
    assert rec.mark() == first + 1  # one sequence, shared with the records
    if ctypes.util.find_library("cuda") is None:
        assert rec.open() != 0
        assert rec.take() == []
    else:
        assert rec.open() == 0
    assert rec.close() == 0
    lc.recorder.cache_clear()
    again = lc.recorder()  # the cached build is loaded, not built again
    assert again is not None


#: a kernel of torch's as CUPTI names it at the launch (mangled), and as a record reads it
FILL = (
    b"_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEvi"
    b"T0_T1_"
)
FILL_NAME = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
    "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"
)


def test_records_read_back_in_order_each_name_demangled_once(fresh_recorder):
    """What a launch callback records (injected here: no callback comes without a driver) is
    read back in one call, in order, kernels demangled, a copy by its label; the library keeps
    each name once and the recorder reads it once; the time taken at the launches is summed
    and handed over once."""
    if lc.cupti_paths(toolchain.cuda_home()) is None:
        pytest.skip("no CUDA toolkit with CUPTI on this machine")
    rec = lc.recorder()
    assert rec is not None, lc.why_not
    rec.spent()
    assert rec.lib.gc_inject(0, HANDLE, 0, FILL) == 0
    assert rec.lib.gc_inject(1, 0, 1, b"Memcpy DtoH") == 0
    assert rec.lib.gc_inject(0, 2, 0, FILL) == 0
    first, copy, again = rec.take()
    assert (first.stream, first.device, first.kind, first.name) == (HANDLE, 0, "kernel", FILL_NAME)
    assert (copy.stream, copy.device, copy.kind, copy.name) == (0, 1, "gpu_memcpy", "Memcpy DtoH")
    assert (again.stream, again.name) == (2, FILL_NAME)
    assert first.seq < copy.seq < again.seq
    assert rec.take() == []  # forgotten once read
    assert rec.names.count(FILL_NAME) == 1 and int(rec.lib.gc_names()) == len(rec.names)
    assert rec.spent() > 0 and rec.spent() == 0


def test_a_threads_own_work_is_not_recorded_for_that_window_only(fresh_recorder):
    """Inside gpucheck's own work around a call (aside) this thread's launches are not
    recorded, another thread's are; an aside a closed window left open hides nothing of the
    next window (a window's open starts a new generation, even one that fails here)."""
    if lc.cupti_paths(toolchain.cuda_home()) is None:
        pytest.skip("no CUDA toolkit with CUPTI on this machine")
    rec = lc.recorder()
    assert rec is not None, lc.why_not
    rec.take()
    rec.aside(True)
    assert rec.lib.gc_inject(0, 0, 0, b"_Z4hashPf") == 1
    other: list[int] = []
    thread = threading.Thread(target=lambda: other.append(rec.lib.gc_inject(0, 7, 0, b"_Z3oddv")))
    thread.start()
    thread.join()
    assert other == [0]
    rec.aside(False)
    assert rec.lib.gc_inject(0, 0, 0, b"_Z4mineid") == 0
    assert [x.name for x in rec.take()] == ["odd()", "mine(int, double)"]
    rec.aside(True)
    rec.open()
    rec.close()
    assert rec.lib.gc_inject(0, 0, 0, b"_Z4nextv") == 0
    assert [x.name for x in rec.take()] == ["next()"]
    rec.aside(False)


HANDLE = 0x55D1_2000  # a stream made current by the test (a handle, as torch gives it)


def _window(launches: list[lc.Launch]) -> lw.Window:
    """One call of ``ext::op`` on device 0 with HANDLE current: markers at 1 (legacy), 2
    (begin) and 10 (end), the launches between or after."""
    events = [lt._marker(1, 0, 0), lt._marker(2, 0, HANDLE), lt._marker(10, 0, HANDLE)]
    events += [lt._launch_event(x) for x in launches]
    events.sort(key=lambda e: e["correlation"])
    entry = {"call": 0, "op": "ext::op", "device": 0, "single_device": True, "frame": None}
    log = [
        {"edge": "legacy", "call": -1, "op": "", "device": 0},
        dict(entry, edge="begin"),
        dict(entry, edge="end"),
    ]
    return lw.Window(events, log, {0: "<stream>"}, recorder="callbacks")


def test_a_callback_window_is_judged_on_its_stream_handles():
    clean = _window([lc.Launch(3, HANDLE, 0, "kernel", "ext::k(float*)")])
    assert lw.judge(clean.launches()) == []
    legacy = _window(
        [
            lc.Launch(3, 0, 0, "kernel", "ext::k(float*)"),
            lc.Launch(4, HANDLE, 0, "gpu_memcpy", "Memcpy DtoD"),
        ]
    )
    (bad,) = lw.judge(legacy.launches())
    assert (bad.kind, bad.op, bad.kernel, bad.ran_on, bad.expected) == (
        "wrong-stream",
        "ext::op",
        "ext::k(float*)",
        (0,),
        HANDLE,
    )
    moved = _window([lc.Launch(3, HANDLE, 1, "kernel", "ext::k(float*)")])
    (bad,) = lw.judge(moved.launches())
    assert (bad.kind, bad.ran_on, bad.expected) == ("kernel-device", (1,), 0)


def test_a_launch_outside_the_call_is_not_the_calls():
    after = _window([lc.Launch(11, 0, 0, "kernel", "ext::late(float*)")])
    assert after.launches() == []
    split = after.split
    assert split is not None and [w.name for w in split.rest] == ["ext::late(float*)"]
    assert split.legacy == {0: 0} and split.current == {0: {HANDLE}}


class _Recorder:
    """A callback recorder without CUPTI: what the trace tells it, and one launch it holds."""

    def __init__(self) -> None:
        self.told: list[bool] = []

    def aside(self, started: bool) -> None:
        self.told.append(started)

    def close(self) -> int:
        return 0

    def spent(self) -> float:
        return 0.25  # seconds taken at the launches: no listener counted them

    def take(self) -> list[lc.Launch]:
        return [lc.Launch(3, HANDLE, 0, "kernel", "ext::k(float*)")]


def _callback_window(monkeypatch) -> tuple[lt.LaunchTrace, _Recorder]:
    """A trace with a callback window open on device 0 (CUDA and the markers faked: no GPU)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    trace = lt.LaunchTrace()
    monkeypatch.setattr(trace, "_mark", lambda entry: trace.window.log.append(entry))
    rec = _Recorder()
    trace._started(lt.Window(recorder="callbacks"))
    trace.callbacks = rec  # type: ignore[assignment]
    return trace, rec


def test_gpuchecks_own_work_in_a_window_is_not_recorded_and_its_end_always_told(monkeypatch):
    """An aside while a callback window is open is fenced by markers and the recorder is told
    to leave the thread's launches out until it ends; its end is told even when the window
    closed meanwhile (the recorder must not keep skipping that thread)."""
    from gpucheck.detectors import op_watch

    trace, rec = _callback_window(monkeypatch)
    monkeypatch.setattr(op_watch, "ASIDE_OBSERVERS", [trace.aside])
    with op_watch.aside():
        assert rec.told == [True]
    assert rec.told == [True, False]
    assert [e["edge"] for e in trace.window.log] == ["begin", "end"]
    with op_watch.aside():
        trace._close()
    assert rec.told == [True, False, True, False] and not trace.skipping


def test_a_window_closed_at_a_backwards_end_is_counted_under_the_trace(monkeypatch):
    """A window kept open for a backward closes when ``backward`` returns, where no listener's
    time is counted: its read, and what the recorder took at the launches, go to the trace's
    cost all the same."""
    from gpucheck.detectors import op_watch

    trace, _ = _callback_window(monkeypatch)
    trace.backward_pending = True
    op_watch.take_spent()
    trace.backward_done()
    assert not trace.open and len(trace.windows) == 1
    assert op_watch.take_spent().get(trace.name, 0.0) >= 0.25


def _kineto(monkeypatch, error: Exception | None = None) -> list[str]:
    """kineto's start, recorded (and failing with ``error``) instead of run."""
    import torch.autograd.profiler as profiler

    started: list[str] = []

    def prepare(config, activities):
        if error is not None:
            raise error
        started.append("prepare")

    monkeypatch.setattr(profiler, "_prepare_profiler", prepare)
    monkeypatch.setattr(profiler, "_enable_profiler", lambda c, a: started.append("enable"))
    return started


def test_a_fallback_to_kineto_is_told_once_unless_asked_for(monkeypatch):
    """Without the callback recorder (its build failed) the trace records with kineto, and
    the first detector reading the case says so, once per process, as info: the checks are
    the same, the cost is not. Asked for with GPUCHECK_LAUNCH_TRACE=kineto, nothing is told."""
    from gpucheck.detectors import CaseInfo
    from gpucheck.detectors.kernel_device import KernelDevice
    from gpucheck.detectors.wrong_stream import WrongStream

    started = _kineto(monkeypatch)
    monkeypatch.setattr(lc, "recorder", lambda: None)
    monkeypatch.setattr(lc, "why_not", "its build failed: cupti.h: No such file or directory")
    monkeypatch.delenv(lc.BACKEND_ENV, raising=False)
    trace = lt.LaunchTrace()
    assert trace._open() and started == ["prepare", "enable"]
    trace.open = False
    assert trace._open()  # another window: told already
    trace.open = False
    case = CaseInfo("cuda:0", "s", "test_x.py::test_x")
    stream, device = WrongStream(), KernelDevice()
    stream.trace = device.trace = trace
    (told,) = device.case_finished(case)
    assert told.message.startswith("detector kernel-device ran with the launch trace on kineto")
    assert "(its build failed: cupti.h: No such file or directory)" in told.message
    assert stream.case_finished(case) == []  # taken by the first reader
    trace = lt.LaunchTrace()
    trace.problems = [("info", "ran with kineto (why)")]
    stream.trace = device.trace = trace
    (told,) = stream.case_finished(case)
    assert (told.kind, told.severity, told.case) == ("detector-error", "info", case.case)
    assert told.message == "detector wrong-stream ran with kineto (why)"

    monkeypatch.setenv(lc.BACKEND_ENV, "kineto")
    trace = lt.LaunchTrace()
    assert trace._open() and trace.take_problems() == []


def test_a_trace_that_cannot_start_says_what_was_not_traced(monkeypatch):
    """kineto refusing to start leaves the case's later calls untraced: a warning that names
    the error, not a silence that reads as a clean case."""
    _kineto(monkeypatch, RuntimeError("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"))
    monkeypatch.setattr(lc, "recorder", lambda: None)
    monkeypatch.setenv(lc.BACKEND_ENV, "kineto")
    trace = lt.LaunchTrace()
    assert not trace._open()
    assert isinstance(trace.failed, RuntimeError)
    ((severity, what),) = trace.take_problems()
    assert severity == "warning"
    assert "RuntimeError: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES" in what
    assert "later op calls were not traced" in what
