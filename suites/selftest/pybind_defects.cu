// gpucheck's self-test: the kernels of a small pybind11 extension in the style of the 3DGS
// rasterizers (pybind_defects.cpp), one source for the clean build and every defect build.
// Defects (never define them in real code; gpucheck._csrc.PYBIND_DEFECTS):
//   GPUCHECK_PYBIND_DEFECT_LEGACY_STREAM  the forward kernel launched with <<<grid, block>>>
//                                         (the legacy default stream), not on `stream`
//   GPUCHECK_PYBIND_DEFECT_CUB_STREAM0    the backward's cub reduction without a stream
//                                         argument (stream 0), as the original rasterizer's
//                                         backward calls cub
#include <cuda_runtime.h>

#include <cub/device/device_reduce.cuh>

#include <cstdint>

// The extension's name (-DTORCH_EXTENSION_NAME) is its kernels' namespace: every build names
// its kernels apart, so the profiler's kernel names tell the builds apart too.
namespace TORCH_EXTENSION_NAME {
namespace {

constexpr int kThreads = 256;

__global__ void scale_kernel(const float* __restrict__ x,  // [n]
                             const float* __restrict__ w,  // [1]
                             float* __restrict__ y,        // [n]
                             int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = x[i] * w[0];
}

__global__ void scale_backward_kernel(const float* __restrict__ grad,  // [n]
                                      const float* __restrict__ x,     // [n]
                                      const float* __restrict__ w,     // [1]
                                      float* __restrict__ grad_x,      // [n]
                                      float* __restrict__ prod,        // [n] grad * x
                                      int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    grad_x[i] = grad[i] * w[0];
    prod[i] = grad[i] * x[i];
  }
}

__global__ void shade_kernel(const float* __restrict__ x,   // [n, channels]
                             const float* __restrict__ bg,  // [channels]
                             float gain, float* __restrict__ out,  // [n, channels]
                             int64_t n, int64_t channels) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n * channels) out[i] = (x[i] + bg[i % channels]) * gain;
}

unsigned blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace
}  // namespace TORCH_EXTENSION_NAME

using namespace TORCH_EXTENSION_NAME;

cudaError_t pybind_scale_launch(const float* x, const float* w, float* y, int64_t n,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
#ifdef GPUCHECK_PYBIND_DEFECT_LEGACY_STREAM
  (void)stream;
  scale_kernel<<<blocks(n), kThreads>>>(x, w, y, n);  // Defect: the legacy default stream
#else
  scale_kernel<<<blocks(n), kThreads, 0, stream>>>(x, w, y, n);
#endif
  return cudaGetLastError();
}

size_t pybind_reduce_temp_bytes(int64_t n) {
  size_t bytes = 0;
  cub::DeviceReduce::Sum(nullptr, bytes, static_cast<const float*>(nullptr),
                         static_cast<float*>(nullptr), static_cast<int>(n));
  return bytes;
}

cudaError_t pybind_scale_backward_launch(const float* grad, const float* x, const float* w,
                                         float* grad_x, float* prod, float* grad_w,
                                         void* temp, size_t temp_bytes, int64_t n,
                                         cudaStream_t stream) {
  if (n == 0) return cudaMemsetAsync(grad_w, 0, sizeof(float), stream);
  scale_backward_kernel<<<blocks(n), kThreads, 0, stream>>>(grad, x, w, grad_x, prod, n);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
#ifdef GPUCHECK_PYBIND_DEFECT_CUB_STREAM0
  // Defect: cub on stream 0. The synchronize makes its input ready, so the result is right
  // (as it always is under CUDA_LAUNCH_BLOCKING=1): only the stream is wrong.
  err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return err;
  return cub::DeviceReduce::Sum(temp, temp_bytes, prod, grad_w, static_cast<int>(n));
#else
  return cub::DeviceReduce::Sum(temp, temp_bytes, prod, grad_w, static_cast<int>(n), stream);
#endif
}

cudaError_t pybind_shade_launch(const float* x, const float* bg, float gain, float* out,
                                int64_t n, int64_t channels, cudaStream_t stream) {
  if (n * channels == 0) return cudaSuccess;
  shade_kernel<<<blocks(n * channels), kThreads, 0, stream>>>(x, bg, gain, out, n, channels);
  return cudaGetLastError();
}
