// gpucheck's self-test: a small pybind11 extension (not torch.ops) in the style of the 3DGS
// rasterizers, called from a torch.autograd.Function (pybind_defects.py). Built with
// torch.utils.cpp_extension.load, once clean and once per defect macro
// (gpucheck._csrc.build_pybind); never use it.
// Defects here (the .cu has the stream ones):
//   GPUCHECK_PYBIND_DEFECT_OUTPUT_CURRENT_DEVICE  scale_forward's result allocated with kCUDA
//                                                 before the guard: on the caller's current
//                                                 device, not on the input's
//   GPUCHECK_PYBIND_DEFECT_SET_DEVICE             a bare cudaSetDevice instead of the scoped
//                                                 guard: the caller's device is not restored
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <tuple>

cudaError_t pybind_scale_launch(const float* x, const float* w, float* y, int64_t n,
                                cudaStream_t stream);
size_t pybind_reduce_temp_bytes(int64_t n);
cudaError_t pybind_scale_backward_launch(const float* grad, const float* x, const float* w,
                                         float* grad_x, float* prod, float* grad_w,
                                         void* temp, size_t temp_bytes, int64_t n,
                                         cudaStream_t stream);
cudaError_t pybind_shade_launch(const float* x, const float* bg, float gain, float* out,
                                int64_t n, int64_t channels, cudaStream_t stream);

#ifdef GPUCHECK_PYBIND_DEFECT_SET_DEVICE
// Defect: the published "fix" of the wrong-device crash; never restores the caller's device.
#define PYBIND_GUARD(t) C10_CUDA_CHECK(cudaSetDevice((t).get_device()))
#else
#define PYBIND_GUARD(t) const at::cuda::OptionalCUDAGuard guard_(at::device_of(t))
#endif

namespace {

void check_vector(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kFloat && t.is_contiguous(),
              "pybind selftest: ", name, " must be a contiguous float32 CUDA tensor, got ",
              t.options());
}

}  // namespace

// y = x * w[0]
at::Tensor scale_forward(const at::Tensor& x,   // [N] float32
                         const at::Tensor& w) {  // [1] float32
  check_vector(x, "x");
#ifdef GPUCHECK_PYBIND_DEFECT_OUTPUT_CURRENT_DEVICE
  // Defect: allocated before the guard with kCUDA, i.e. on the caller's current device.
  at::Tensor result = at::empty(x.sizes(), at::device(at::kCUDA).dtype(at::kFloat));
#endif
  PYBIND_GUARD(x);
  check_vector(w, "w");
  TORCH_CHECK(w.numel() == 1 && w.device() == x.device(), "pybind selftest: w must be [1] on ",
              x.device(), ", got ", w.sizes(), " on ", w.device());
  at::Tensor y = at::empty_like(x);
  C10_CUDA_CHECK(pybind_scale_launch(x.data_ptr<float>(), w.data_ptr<float>(),
                                     y.data_ptr<float>(), x.numel(),
                                     c10::cuda::getCurrentCUDAStream()));
#ifdef GPUCHECK_PYBIND_DEFECT_OUTPUT_CURRENT_DEVICE
  result.copy_(y);  // a copy to the caller's current device
  return result;
#else
  return y;
#endif
}

// (grad_x, grad_w) of y = x * w[0]: grad * w[0], sum(grad * x) (cub)
std::tuple<at::Tensor, at::Tensor> scale_backward(const at::Tensor& grad,  // [N] float32
                                                  const at::Tensor& x,     // [N] float32
                                                  const at::Tensor& w) {   // [1] float32
  check_vector(grad, "grad");
  PYBIND_GUARD(grad);
  check_vector(x, "x");
  check_vector(w, "w");
  at::Tensor grad_x = at::empty_like(x);
  at::Tensor prod = at::empty_like(x);
  at::Tensor grad_w = at::empty({1}, w.options());
  const size_t bytes = pybind_reduce_temp_bytes(x.numel());
  at::Tensor temp = at::empty({static_cast<int64_t>(bytes) + 1}, x.options().dtype(at::kByte));
  C10_CUDA_CHECK(pybind_scale_backward_launch(
      grad.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(),
      grad_x.data_ptr<float>(), prod.data_ptr<float>(), grad_w.data_ptr<float>(),
      temp.data_ptr(), bytes, x.numel(), c10::cuda::getCurrentCUDAStream()));
  return {grad_x, grad_w};
}

// out = (x + bg per channel) * gain. Like the rasterizers, it does not check bg's device: a
// CPU bg (a config slip) hands the kernel a host pointer. gain is read on the host (.item()):
// a 0-dim tensor on any device, as torch's own ops take a CPU scalar.
at::Tensor shade(const at::Tensor& x,      // [N, C] float32
                 const at::Tensor& bg,     // [C] float32
                 const at::Tensor& gain) {  // [] float32, any device
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "pybind selftest: x must be a contiguous [N, C] float32 CUDA tensor, got ",
              x.sizes(), " ", x.options());
  TORCH_CHECK(bg.numel() == x.size(1) && bg.scalar_type() == at::kFloat && bg.is_contiguous(),
              "pybind selftest: bg must be [", x.size(1), "] float32, got ", bg.sizes());
  TORCH_CHECK(gain.dim() == 0, "pybind selftest: gain must be 0-dim, got ", gain.sizes());
  PYBIND_GUARD(x);
  const float g = gain.item<float>();
  at::Tensor out = at::empty_like(x);
  C10_CUDA_CHECK(pybind_shade_launch(x.data_ptr<float>(), bg.data_ptr<float>(), g,
                                     out.data_ptr<float>(), x.size(0), x.size(1),
                                     c10::cuda::getCurrentCUDAStream()));
  return out;
}

// The forward kernel for callers that hold raw pointers (ctypes): launches on `stream`, which
// the caller passes (nullptr: the legacy default stream). Not a pybind function: the per-call
// watch never sees it, only the profiler does.
extern "C" __attribute__((visibility("default"))) int gpucheck_pybind_scale_raw(
    const float* x, const float* w, float* y, int64_t n, void* stream) {
  return static_cast<int>(
      pybind_scale_launch(x, w, y, n, static_cast<cudaStream_t>(stream)));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scale_forward", &scale_forward, "y = x * w[0]", py::arg("x"), py::arg("w"));
  m.def("scale_backward", &scale_backward, "grad_x, grad_w of scale_forward", py::arg("grad"),
        py::arg("x"), py::arg("w"));
  m.def("shade", &shade, "(x + bg per channel) * gain", py::arg("x"), py::arg("bg"),
        py::arg("gain"));
}
