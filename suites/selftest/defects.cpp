// gpucheck's harness self-test: a small extension with deliberate defects (never use it).
// Built at test time by suites/selftest/test_selftest.py with torch.utils.cpp_extension.load.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

#include <system_error>

cudaError_t selftest_add_one(const float* in, float* out, int64_t n, int64_t overrun,
                             cudaStream_t stream);

namespace {

at::Tensor launch(const at::Tensor& x,  // [N] float32
                  int64_t overrun) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "selftest: x must be a contiguous float32 CUDA tensor, got ", x.options());
  at::Tensor out = at::empty_like(x);
  C10_CUDA_CHECK(selftest_add_one(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(),
                                  overrun, c10::cuda::getCurrentCUDAStream()));
  return out;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wterminate"
void fail_inside_noexcept() noexcept {  // like thrust errors escaping a destructor: terminate
  throw std::system_error(std::make_error_code(std::errc::invalid_argument),
                          "selftest: error escaping a noexcept function");
}
#pragma GCC diagnostic pop

}  // namespace

// Correct: guard on the input's device, then launch on that device's current stream.
at::Tensor add_one_guarded(const at::Tensor& x) {
  const at::cuda::OptionalCUDAGuard guard(at::device_of(x));
  return launch(x, 0);
}

// Defect (stories 1 and 2): no device guard. The stream and the launch belong to whatever
// device is current, while the pointers belong to x's device.
at::Tensor add_one_unguarded(const at::Tensor& x) { return launch(x, 0); }

// Defect: writes 64 floats past the end of the output (silent without compute-sanitizer).
at::Tensor add_one_overrun(const at::Tensor& x) {
  const at::cuda::OptionalCUDAGuard guard(at::device_of(x));
  return launch(x, 64);
}

// Defect (story 2's "terminate called after throwing ..."): the process aborts.
at::Tensor abort_process(const at::Tensor& x) {
  fail_inside_noexcept();
  return x;
}

// Defect (leak): a raw cudaMalloc per call, never freed. The caching allocator never sees it;
// only the process's memory in NVML grows.
at::Tensor add_one_leaking(const at::Tensor& x,  // [N] float32
                           int64_t leak_bytes) {
  const at::cuda::OptionalCUDAGuard guard(at::device_of(x));
  void* lost = nullptr;
  C10_CUDA_CHECK(cudaMalloc(&lost, static_cast<size_t>(leak_bytes)));
  C10_CUDA_CHECK(cudaMemsetAsync(lost, 0, static_cast<size_t>(leak_bytes),
                                 c10::cuda::getCurrentCUDAStream()));
  return launch(x, 0);
}

// Defect (growth): a scratch buffer of N x N floats where N would do.
at::Tensor add_one_quadratic_scratch(const at::Tensor& x) {  // [N] float32
  const at::cuda::OptionalCUDAGuard guard(at::device_of(x));
  at::Tensor scratch = at::zeros({x.numel(), x.numel()}, x.options());  // [N, N]
  return launch(x, 0) + scratch.select(0, 0);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add_one_guarded", &add_one_guarded);
  m.def("add_one_unguarded", &add_one_unguarded);
  m.def("add_one_overrun", &add_one_overrun);
  m.def("abort_process", &abort_process);
  m.def("add_one_leaking", &add_one_leaking);
  m.def("add_one_quadratic_scratch", &add_one_quadratic_scratch);
}
