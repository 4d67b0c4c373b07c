"""GPU verification of unwritten outputs and of sanitizer records traced to the op:

    python tools/gpu_steps/verify/unwritten.py OUT_DIR  (`tools/gpu unwritten`)

Builds a small CUDA pybind11 extension (``torch.utils.cpp_extension.load``, the way the
field's extensions are built), called the way they are (an ``autograd.Function`` for the
backward), with: a projection that leaves culled points unwritten where their radius is 0 (a
convention: no error anywhere), a rasterizer that leaves the pixels of masked tiles unwritten
(a bug) and its fixed twin, a backward kernel with a shared-memory race, and a kernel that
writes one element past its output. A suite of cases on GPU 0 calls them; checks, each
printed as PASS/FAIL with the evidence:

1. ``gpucheck run`` (the plain pass): the projection's case passes with notes only (the
   ``unwritten-output`` convention naming ``radii``) and its determinism test has no
   ``numerics`` finding; the masked case has ``unwritten-output`` errors naming ``alpha`` and
   ``last_ids`` and the 16×16 tiles; the fixed twin is clean; the probe's cost is in
   ``cost_s``;
2. ``--mode sanitizer:initcheck``: torch's copy of the masked alpha is traced to the op
   (``output 0 (alpha) of `...rasterize` was never written ...; read by torch's copy at
   test_unwritten_gpu.py:N``); the projection's copy of culled rows is no error; a case that
   prints more records than compute-sanitizer's limit ends its worker with a
   ``sanitizer-limit`` finding that says how many were dropped, and the next case still has
   its own records (a fresh worker); the masked case's ``last_ids``, never written either,
   is no marker of ``alpha`` (initcheck reports gpucheck's read of it right after the call);
   the fixed twin is clean there too (no record of gpucheck's own reads in its slice);
3. ``--mode sanitizer:racecheck``: the race is one ``data-race`` naming the backward op,
   though compute-sanitizer writes its records after the call returned (while the probe
   re-runs it);
4. ``--mode sanitizer:memcheck``: the overrun is ``out-of-bounds`` naming the op and the
   tensor it allocated (``1 bytes after a tensor ... allocated while it ran``), though the
   tool ends the worker inside the call (the controller traces it from the calls the worker
   wrote under way).

The extension's entry points take any layout (``.contiguous()``), so the memory-layout check
has nothing to say: the checks above test what they mean.

The messages found are printed, so the log shows what a user reads. The suite reads the
outputs through torch's copy kernel (a dtype conversion), as in the field's report; a plain
``.cpu()`` of a contiguous tensor is a ``cudaMemcpy``, whose initcheck records are not yet
traced (no recorded sample of their wording).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "verify-out").resolve()
SUITE = OUT / "suite"
SUITE.mkdir(parents=True, exist_ok=True)
NAME = "gpucheck_verify_unwritten"
SOURCE = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <vector>

__global__ void project_kernel(const float* means, float* xy, float* depth, int* radii,
                               int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float z = means[3 * i + 2];
  if (z <= 0.f) { radii[i] = 0; return; }  // culled: xy and depth never written, radius 0
  xy[2 * i] = means[3 * i] / z;
  xy[2 * i + 1] = means[3 * i + 1] / z;
  depth[i] = z;
  radii[i] = 3;
}

std::vector<at::Tensor> project(const at::Tensor& means_in) {  // [N, 3]
  const c10::cuda::OptionalCUDAGuard guard(device_of(means_in));
  const auto means = means_in.contiguous();  // the kernel indexes it as contiguous
  auto n = means.size(0);
  auto xy = at::empty({n, 2}, means.options());
  auto depth = at::empty({n}, means.options());
  auto radii = at::empty({n}, means.options().dtype(at::kInt));
  if (n == 0) return {xy, radii, depth};
  project_kernel<<<(n + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      means.data_ptr<float>(), xy.data_ptr<float>(), depth.data_ptr<float>(),
      radii.data_ptr<int>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {xy, radii, depth};
}

__global__ void raster_kernel(const float* colors, const bool* mask, float* alpha, int* last,
                              int h, int w, int tiles_x, int tile) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= w || y >= h) return;
  if (!mask[(y / tile) * tiles_x + x / tile]) return;  // a masked tile: never written
  int p = y * w + x;
  alpha[p] = (colors[3 * p] + colors[3 * p + 1] + colors[3 * p + 2]) / 3.f;
  last[p] = 1;
}

std::vector<at::Tensor> rasterize(const at::Tensor& colors_in,  // [H, W, 3]
                                  const at::Tensor& mask_in,    // [H/tile, W/tile] bool
                                  int64_t tile, bool fixed) {
  const c10::cuda::OptionalCUDAGuard guard(device_of(colors_in));
  const auto colors = colors_in.contiguous(), mask = mask_in.contiguous();
  auto h = colors.size(0), w = colors.size(1);
  auto ints = colors.options().dtype(at::kInt);
  auto alpha = fixed ? at::zeros({h, w, 1}, colors.options())
                     : at::empty({h, w, 1}, colors.options());
  auto last = fixed ? at::zeros({h, w}, ints) : at::empty({h, w}, ints);
  dim3 block(16, 16), grid((w + 15) / 16, (h + 15) / 16);
  raster_kernel<<<grid, block, 0, c10::cuda::getCurrentCUDAStream()>>>(
      colors.data_ptr<float>(), mask.data_ptr<bool>(), alpha.data_ptr<float>(),
      last.data_ptr<int>(), h, w, mask.size(1), tile);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {alpha, last};
}

__global__ void smooth_backward_kernel(const float* g, float* out, int n) {
  __shared__ float tile[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? g[i] : 0.f;
  // the missing __syncthreads(): a neighbour's entry is read before it is written
  float left = tile[(threadIdx.x + 255) % 256];
  if (i < n) out[i] = 0.5f * (tile[threadIdx.x] + left);
}

at::Tensor smooth_backward(const at::Tensor& grad_in) {  // [N]
  const c10::cuda::OptionalCUDAGuard guard(device_of(grad_in));
  const auto grad = grad_in.contiguous();
  auto out = at::empty_like(grad);
  int n = grad.numel();
  smooth_backward_kernel<<<(n + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      grad.data_ptr<float>(), out.data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

__global__ void overrun_kernel(const float* x, float* out, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i <= n) out[i] = x[i < n ? i : 0] + 1.f;  // i == n: one element past the end
}

at::Tensor overrun(const at::Tensor& x_in) {  // [N]
  const c10::cuda::OptionalCUDAGuard guard(device_of(x_in));
  const auto x = x_in.contiguous();
  auto out = at::empty_like(x);
  int64_t n = x.numel();
  overrun_kernel<<<(n + 256) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), out.data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("project", &project, "project(means) -> tuple[xy: Tensor, radii: Tensor, depth: Tensor]",
        py::arg("means"));
  m.def("rasterize", &rasterize,
        "rasterize(colors, mask, tile, fixed) -> tuple[alpha: Tensor, last_ids: Tensor]",
        py::arg("colors"), py::arg("mask"), py::arg("tile"), py::arg("fixed"));
  m.def("smooth_backward", &smooth_backward, py::arg("grad"));
  m.def("overrun", &overrun, py::arg("x"));
}
"""
(SUITE / "test_unwritten_gpu.py").write_text(
    """import importlib.util, os
import pytest, torch

spec = importlib.util.spec_from_file_location(os.environ["EXT_NAME"], os.environ["EXT_PATH"])
ext = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ext)  # after gpucheck's plugin: its functions are watched


def _means(device, n=64):
    means = torch.rand(n, 3, device=device) + 0.5
    means[::4, 2] = -1.0  # culled
    return means


def _mask(device, h, w, tile=16):
    mask = torch.ones(h // tile, w // tile, dtype=torch.bool)
    mask[::2, ::3] = False
    return mask.to(device)


class Smooth(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        return ext.smooth_backward(grad.contiguous())


@pytest.mark.sanitizer(tools=("initcheck",))
def test_1_projection(gpu_device):
    xy, radii, depth = ext.project(_means(gpu_device))
    host = xy.double().cpu()  # torch's copy reads the culled rows too: the convention
    assert torch.isfinite(host[radii.cpu() > 0]).all()


@pytest.mark.sanitizer(tools=("initcheck",))
def test_2_projection_is_deterministic(gpu_device):
    means = _means(gpu_device)
    a, ra, _ = ext.project(means)
    b, rb, _ = ext.project(means)
    keep = ra > 0
    assert torch.equal(a[keep], b[keep]) and torch.equal(ra, rb)


@pytest.mark.sanitizer(tools=("initcheck",))
def test_3_masked_many(gpu_device):
    alpha, _ = ext.rasterize(torch.rand(256, 256, 3, device=gpu_device),
                             _mask(gpu_device, 256, 256), 16, False)
    alpha.double()  # 12,288 unwritten pixels read: more records than the tool prints


@pytest.mark.sanitizer(tools=("initcheck",))
def test_4_masked(gpu_device):
    alpha, _ = ext.rasterize(torch.rand(64, 48, 3, device=gpu_device),
                             _mask(gpu_device, 64, 48), 16, False)
    assert alpha.double().shape == (64, 48, 1)  # torch's copy kernel reads them


@pytest.mark.sanitizer(tools=("initcheck",))
def test_5_fixed(gpu_device):
    alpha, _ = ext.rasterize(torch.rand(64, 48, 3, device=gpu_device),
                             _mask(gpu_device, 64, 48), 16, True)
    assert float(alpha.cpu()[:16, :16].abs().sum()) == 0.0


@pytest.mark.sanitizer(tools=("racecheck",))
def test_6_race(gpu_device):
    x = torch.rand(4096, device=gpu_device, requires_grad=True)
    Smooth.apply(x).sum().backward()


@pytest.mark.sanitizer(tools=("memcheck",))
def test_7_overrun(gpu_device):
    ext.overrun(torch.rand(1000, device=gpu_device))
    torch.cuda.synchronize()
"""
)
results: list[tuple[str, bool]] = []


def check(name: str, ok: bool, evidence: str) -> None:
    results.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {evidence}", flush=True)


def build() -> str:
    from torch.utils import cpp_extension

    folder = OUT / "build"
    folder.mkdir(exist_ok=True)
    (folder / "ext.cu").write_text(SOURCE)
    module = cpp_extension.load(
        name=NAME, sources=[str(folder / "ext.cu")], build_directory=str(folder), verbose=False
    )
    return str(module.__file__)


def run(folder: str, *args: str, **env: str) -> dict[str, dict]:
    """``gpucheck run`` on GPU 0 into OUT/folder; the case records by test name, diagnosis
    records' findings added."""
    cmd = [sys.executable, "-m", "gpucheck.cli", "run", "--device", "0", "--quiet"]
    cmd += ["--suite", str(SUITE / "test_unwritten_gpu.py"), "--out", str(OUT / folder), *args]
    t0 = time.monotonic()
    with (OUT / f"{folder}.log").open("w") as f:
        proc = subprocess.run(
            cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **env}, timeout=300
        )
    print(f"-- {folder}: exit {proc.returncode} in {time.monotonic() - t0:.0f} s", flush=True)
    cases: dict[str, dict] = {}
    path = OUT / folder / "results.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        r = json.loads(line)
        name = str(r.get("case", "")).rsplit("::", 1)[-1].split("[")[0]
        if r.get("record") == "case":
            cases[name] = {
                **r,
                "findings": r.get("findings", []) + cases.get(name, {}).get("findings", []),
            }
        elif r.get("record") == "diagnosis":
            cases.setdefault(name, {"findings": []})["findings"] += r.get("findings", [])
    for name, r in sorted(cases.items()):
        for f in r["findings"]:
            print(f"   {name}: {f['kind']}/{f['severity']}: {f['message'][:220]}", flush=True)
    return cases


def kinds(case: dict, severity: str | None = None) -> list[str]:
    return [f["kind"] for f in case.get("findings", []) if severity in (None, f["severity"])]


def messages(case: dict, kind: str) -> list[str]:
    return [f["message"] for f in case.get("findings", []) if f["kind"] == kind]


env = {"EXT_NAME": NAME, "EXT_PATH": build()}

# 1. the plain pass
plain = run("plain", **env)
proj, det = plain.get("test_1_projection", {}), plain.get("test_2_projection_is_deterministic", {})
check(
    "plain: the projection's culled rows are its convention (notes only, no numerics finding)",
    proj.get("status") == "passed"
    and kinds(proj) == ["unwritten-output"] * 2
    and all(f["severity"] == "info" and "(radii) is 0" in f["message"] for f in proj["findings"])
    and det.get("status") == "passed"
    and "numerics" not in kinds(det)
    and not kinds(det, "error"),
    f"{kinds(proj)} {kinds(det)}",
)
masked = plain.get("test_4_masked", {})
said = messages(masked, "unwritten-output")
check(
    "plain: the masked tiles are unwritten-output errors naming alpha, last_ids and the tiles",
    sorted(m.split(" was never written")[0].split(": ", 1)[1] for m in said)
    == ["output 0 (alpha)", "output 1 (last_ids)"]
    and all("tiles of 16×16" in m for m in said)
    and kinds(masked, "error") == ["unwritten-output"] * 2,
    "; ".join(m[:160] for m in said),
)
check(
    "plain: the fixed twin is clean, and the probe's seconds are in cost_s",
    plain.get("test_5_fixed", {}).get("findings") == []
    and masked.get("cost_s", {}).get("unwritten-output", 0) > 0,
    f"cost_s of the masked case: {masked.get('cost_s')}",
)

# 2. initcheck
init = run("initcheck", "--mode", "sanitizer:initcheck", **env)
masked4 = init.get("test_4_masked", {})
traced = messages(masked4, "unwritten-output")
check(
    "initcheck: torch's copy of the masked alpha is traced to the op and the test's line "
    "(last_ids, never written either, is no marker)",
    any(
        f["kind"] == "unwritten-output"
        and f["severity"] == "error"
        and f"output 0 (alpha) of `{NAME}.rasterize` was never written at 512 element" in m
        and "read by torch's copy at test_unwritten_gpu.py:" in m
        for f in masked4.get("findings", [])
        for m in [f["message"]]
    )
    and not any("by design" in m for m in traced),
    "; ".join(m[:220] for m in traced),
)
fixed = init.get("test_5_fixed", {})
check(
    "initcheck: the fixed twin is clean (gpucheck's own reads of the masked case's outputs "
    "are not in its slice)",
    fixed.get("status") == "passed" and not kinds(fixed, "error"),
    f"{[(f['kind'], f['message'][:160]) for f in fixed.get('findings', [])]}",
)
check(
    "initcheck: the projection's copy of culled rows is no error",
    not kinds(init.get("test_1_projection", {}), "error")
    and not kinds(init.get("test_2_projection_is_deterministic", {}), "error"),
    f"{init.get('test_1_projection', {}).get('findings')}",
)
limit = messages(init.get("test_3_masked_many", {}), "sanitizer-limit")
check(
    "initcheck: the case past the print limit says how many records were dropped, the next "
    "case has its own",
    len(limit) == 1 and "were not printed" in limit[0] and bool(traced),
    "; ".join(limit),
)

# 3. racecheck
race = run("racecheck", "--mode", "sanitizer:racecheck", **env)
races = messages(race.get("test_6_race", {}), "data-race")
check(
    "racecheck: the shared-memory race is one data-race naming the backward op (its records "
    "written after the call returned, the probe's re-runs' too)",
    len(races) == 1
    and races[0].startswith(f"`{NAME}.smooth_backward` launched smooth_backward_kernel, which ")
    and "in Smooth.backward" in races[0],
    "; ".join(races),
)

# 4. memcheck
mem = run("memcheck", "--mode", "sanitizer:memcheck", **env)
oob = messages(mem.get("test_7_overrun", {}), "out-of-bounds")
check(
    "memcheck: the overrun is out-of-bounds naming the op and the tensor it allocated, "
    "though the tool ended the worker inside the call",
    any(
        f"`{NAME}.overrun` launched overrun_kernel" in m
        and (
            f"1 bytes after a tensor {NAME}.overrun allocated while it ran (shape [1000]" in m
            or "1 bytes after output 0 of" in m  # had the worker lived to see it returned
        )
        and "test_unwritten_gpu.py:" in m
        for m in oob
    ),
    "; ".join(oob),
)

failed = [name for name, ok in results if not ok]
print(f"{len(results) - len(failed)} of {len(results)} PASS", flush=True)
sys.exit(1 if failed else 0)
