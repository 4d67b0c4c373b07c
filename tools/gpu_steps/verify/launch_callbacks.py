"""GPU verification of the launch trace's callback recorder (gpucheck/detectors/launch_callbacks):

    python tools/gpu_steps/verify/launch_callbacks.py OUT_DIR  (`tools/gpu launch-callbacks`)

Checks, each printed as PASS/FAIL with the evidence (OUT_DIR/launch_callbacks.json: every
number):
1. the recorder builds, loads and opens;
2. a kernel on the legacy default stream, on a side stream and (2+ GPUs) on cuda:1 is recorded
   with the stream torch names (``cuda_stream``) and the device, once each, a copy as a copy;
3. a window of the trace itself: an extension op's call gives a "callbacks" window whose
   launches the detectors attribute to it on the current stream;
4. cost: a small launch under CUDA_LAUNCH_BLOCKING before any window, inside one, and after
   200 windows (the recorder must leave launches as they were: within 10 %), and a window's
   own time (open, a launch, close, take), medians; a thread's launches inside gpucheck's own
   work (an aside) are not recorded, the recorder's own time at the launches is counted, and
   what reading a window back costs a record;
5. a test's own profiler gets its GPU events when it starts while the trace keeps a window
   open for an op's backward (the trace lets CUPTI go first) and after the windows, and while
   kineto holds CUPTI the trace falls back to a kineto window.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("CUDA_LAUNCH_BLOCKING", "1")
os.environ["GPUCHECK_LAUNCH_TRACE"] = "callbacks"  # the one under test, whatever the caller set

import torch

from gpucheck.detectors import launch_callbacks as lc
from gpucheck.detectors import launch_trace as lt
from gpucheck.detectors import launch_windows as lw

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "verify-out")
OUT.mkdir(parents=True, exist_ok=True)
results: list[tuple[str, bool, str]] = []
numbers: dict[str, object] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}


def check(name: str, ok: bool, evidence: str) -> None:
    results.append((name, ok, evidence))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {evidence}", flush=True)


dev = torch.device("cuda", 0)
x = torch.randn(4096, device=dev)


# the launch cost as benchmarks/cupti_window.py measures it
_spec = importlib.util.spec_from_file_location(
    "cupti_window", Path(__file__).resolve().parents[3] / "benchmarks" / "cupti_window.py"
)
assert _spec is not None and _spec.loader is not None
cupti_window = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cupti_window)


def median_launch() -> float:
    return statistics.median(cupti_window.launch_us(x) for _ in range(5))


cupti_window.launch_us(x, 200)
before = median_launch()
rec = lc.recorder()
check("builds and loads", rec is not None, lc.why_not or "loaded")
if rec is None:
    sys.exit(1)
rc = rec.open()
check("opens", rc == 0, f"gc_open -> {rc}")

side = torch.cuda.Stream(dev)
torch.add(x, 1.0)
with torch.cuda.stream(side):
    torch.mul(x, 2.0)
host = torch.empty(4096, pin_memory=True)
host.copy_(x, non_blocking=True)
torch.cuda.synchronize(dev)
two = torch.cuda.device_count() > 1
if two:
    with torch.cuda.device(1):
        torch.ones(8, device="cuda:1").add_(1)  # two kernels: a fill, an add
rec.close()
got = rec.take()
numbers["records"] = [(r.device, r.stream, r.kind, r.name[:80]) for r in got]
kernels = [r for r in got if r.kind == "kernel"]
want = [(0, torch.cuda.default_stream(dev).cuda_stream), (0, side.cuda_stream)]
check(
    "streams and device of each launch",
    [(r.device, r.stream) for r in kernels[:2]] == want,
    f"{[(r.device, hex(r.stream)) for r in kernels[:2]]} against {want}",
)
check(
    "a copy is a copy",
    any(r.kind == "gpu_memcpy" and r.name.startswith("Memcpy DtoH") for r in got),
    f"{[(r.kind, r.name) for r in got if r.kind != 'kernel']}",
)
check(
    "each launch once (the runtime's call, not its driver call again)",
    len(kernels) == (4 if two else 2) and kernels[-1].device == (1 if two else 0),
    f"{len(kernels)} kernels: {[(r.device, r.name[:40]) for r in kernels]}",
)

# gpucheck's own work around a call (an aside) on this thread is not recorded, the rest is; the
# recorder's time at the launches is counted; a window is read back in one call
rec.open()
rec.spent()
rec.aside(True)
torch.sub(x, 1.0)  # gpucheck's own: left out
rec.aside(False)
for _ in range(2000):
    torch.mul(x, 3.0)
torch.cuda.synchronize(dev)
rec.close()
spent = rec.spent()
t = time.perf_counter()
got = rec.take()
read_us = (time.perf_counter() - t) * 1e6 / max(1, len(got))
numbers["window_of_2000"] = {"spent_us_a_launch": spent * 1e6 / 2000, "read_us_a_record": read_us}
check(
    "an aside's launches are left out, the others recorded, their cost counted",
    len(got) == 2000 and len({r.name for r in got}) == 1 and spent > 0,
    f"{len(got)} records of 2001 launches (1 aside), {len({r.name for r in got})} name(s); "
    f"the recorder {spent * 1e6 / 2000:.2f} us a launch, read {read_us:.2f} us a record",
)

# the trace itself on an extension op (the bundled ssim), a side stream current
from gpucheck.detectors import op_watch  # noqa: E402
from gpucheck.ops import ssim  # noqa: E402

a = torch.rand(1, 3, 64, 64, device=dev)
b = torch.rand(1, 3, 64, 64, device=dev)
ssim(a, b, train=False)  # warm-up outside the window
trace = lt.LaunchTrace()
with torch.cuda.stream(side):
    trace.acquire()
    ssim(a, b, train=False)
    windows = trace.finish()
launches = [lc_ for w in windows for lc_ in w.launches()]
check(
    "an op's window is a callback window, its kernels on the current stream",
    bool(windows)
    and all(w.recorder == "callbacks" for w in windows)
    and bool(launches)
    and all(o.work.stream == side.cuda_stream for o in launches)
    and lw.judge(launches) == [],
    f"{[w.recorder for w in windows]}, {len(launches)} launches, judged {lw.judge(launches)}",
)
check("the watch has no listener errors", not op_watch.errors, str(op_watch.errors))

rec.open()
inside = median_launch()
rec.close()
rec.take()
w = []
for _ in range(200):
    t = time.perf_counter()
    rec.open()
    torch.add(x, 1.0)
    rec.close()
    rec.take()
    w.append((time.perf_counter() - t) * 1e3)
after = median_launch()
numbers.update(
    launch_us={"before": before, "inside": inside, "after": after},
    window_ms={"first": w[0], "median": statistics.median(w[1:])},
)
check(
    "launches after 200 windows cost what they did before (within 10 %)",
    after <= before * 1.10,
    f"{before:.2f} -> {after:.2f} us a launch; inside a window {inside:.2f} us; "
    f"a window {statistics.median(w[1:]):.3f} ms",
)


def profiled() -> int:
    """A test's own profiler around one launch: the GPU events it got."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.add(x, 1.0)
        torch.cuda.synchronize(dev)
    return sum(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events())


# a window the trace keeps open for an op's backward while the test starts its own profiler
# (kineto's first start in this process): the trace must let CUPTI go before kineto asks
a1 = a.clone().requires_grad_(True)
trace = lt.LaunchTrace()
trace.acquire()
loss = ssim(a1, b)  # train: its output requires grad, the window waits for the backward
kept = trace.open and trace.callbacks is not None
try:
    events, why = profiled(), ""
except Exception as err:  # the profiler refused to start: the FAIL says how
    events, why = 0, f" ({type(err).__name__}: {err})"
loss.backward()
windows = trace.finish()
n = sum(len(w.launches()) for w in windows)
check(
    "a test's profiler started while the trace keeps a callback window open gets its GPU events",
    kept and events > 0 and [w.recorder for w in windows] == ["callbacks"] and n > 0,
    f"kept open: {kept}; {events} events{why}; windows {[w.recorder for w in windows]}, "
    f"{n} launches of the op",
)
kineto = profiled()
check("a test's own profiler still gets its GPU events", kineto > 0, f"{kineto} events")
held = rec.open()
if held == 0:
    rec.close()
trace = lt.LaunchTrace()
trace.acquire()
ssim(a, b, train=False)
windows = trace.finish()
check(
    "while kineto holds CUPTI the trace falls back to its windows",
    held != 0 and bool(windows) and all(w.recorder == "kineto" for w in windows),
    f"gc_open -> {held}; windows {[w.recorder for w in windows]}",
)

(OUT / "launch_callbacks.json").write_text(json.dumps(numbers, indent=1, default=str))
failed = [n for n, ok, _ in results if not ok]
print(f"{len(results) - len(failed)} PASS, {len(failed)} FAIL")
sys.exit(1 if failed else 0)
