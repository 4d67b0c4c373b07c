// gpucheck's harness self-test: the kernel of a deliberately broken extension (defects.cpp).
#include <cuda_runtime.h>

#include <cstdint>

namespace {
__global__ void add_one(const float* __restrict__ in, float* __restrict__ out, int64_t n,
                        int64_t overrun) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n + overrun) out[i] = in[i < n ? i : 0] + 1.0f;  // overrun > 0: writes past the end
}
}  // namespace

// Launches on `stream`, which the caller took from whatever device was current.
cudaError_t selftest_add_one(const float* in, float* out, int64_t n, int64_t overrun,
                             cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = (n + overrun + threads - 1) / threads;
  add_one<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(in, out, n, overrun);
  return cudaGetLastError();
}
