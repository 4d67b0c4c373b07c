// gpucheck's self-test zoo: the kernels of a custom RNN in the shape of RWKV-4's wkv_cuda.cu:
// one thread per (batch, channel), sequential over time, launched as RWKV launches them
// (min(C, 32) threads a block). The recurrence: a = exp(-exp(w)), z_t = k_t v_t,
// h_t = a h_{t-1} + z_t (h_{-1} = h0, or 0), y_t = h_t + u z_t. One source for the clean build
// and every defect build.
//   GPUCHECK_ZOO_LEGACY_STREAM  both kernels launched with <<<grid, block>>>, as RWKV's were
#include "zoo_stream.cuh"

#include <cstdint>

namespace TORCH_EXTENSION_NAME {
namespace {

__global__ void kernel_forward(int B, int T, int C, const float* __restrict__ w,
                               const float* __restrict__ u, const float* __restrict__ k,
                               const float* __restrict__ v, const float* __restrict__ h0,
                               float* __restrict__ y) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  const int b = idx / C, c = idx % C;
  const int offset = b * T * C + c;
  const float a = expf(-expf(w[c]));
  float h = h0 != nullptr ? h0[b * C + c] : 0.f;
  for (int t = 0; t < T; ++t) {
    const int i = offset + t * C;
    const float z = k[i] * v[i];
    h = a * h + z;
    y[i] = h + u[c] * z;
  }
}

// gk, gv [B, T, C]; gw, gu, gh0 [B, C] (the caller sums gw, gu over the batch)
__global__ void kernel_backward(int B, int T, int C, const float* __restrict__ w,
                                const float* __restrict__ u, const float* __restrict__ k,
                                const float* __restrict__ v, const float* __restrict__ h0,
                                const float* __restrict__ y, const float* __restrict__ gy,
                                float* __restrict__ gw, float* __restrict__ gu,
                                float* __restrict__ gk, float* __restrict__ gv,
                                float* __restrict__ gh0) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  const int b = idx / C, c = idx % C;
  const int offset = b * T * C + c;
  const float ew = expf(w[c]);
  const float a = expf(-ew);
  float gh = 0.f, ga = 0.f, gu_sum = 0.f;
  for (int t = T - 1; t >= 0; --t) {
    const int i = offset + t * C;
    const float z = k[i] * v[i];
    gh = gy[i] + a * gh;  // dL/dh_t
    float h_prev = h0 != nullptr ? h0[b * C + c] : 0.f;
    if (t > 0) {
      const int p = i - C;
      h_prev = y[p] - u[c] * k[p] * v[p];
    }
    ga += gh * h_prev;
    gu_sum += gy[i] * z;
    const float gz = gh + u[c] * gy[i];
    gk[i] = gz * v[i];
    gv[i] = gz * k[i];
  }
  gw[b * C + c] = ga * a * -ew;
  gu[b * C + c] = gu_sum;
  gh0[b * C + c] = a * gh;
}

}  // namespace

cudaError_t wkv_forward_launch(int B, int T, int C, const float* w, const float* u,
                               const float* k, const float* v, const float* h0, float* y,
                               cudaStream_t stream) {
  const dim3 threadsPerBlock(C < 32 ? C : 32);
  const dim3 numBlocks(B * C / threadsPerBlock.x);
#ifdef GPUCHECK_ZOO_LEGACY_STREAM
  cudaError_t err = zoo_legacy_enter(stream);
  if (err != cudaSuccess) return err;
  kernel_forward<<<numBlocks, threadsPerBlock>>>(B, T, C, w, u, k, v, h0, y);  // Defect
  err = cudaGetLastError();
  return err != cudaSuccess ? err : zoo_legacy_exit();
#else
  kernel_forward<<<numBlocks, threadsPerBlock, 0, stream>>>(B, T, C, w, u, k, v, h0, y);
  return cudaGetLastError();
#endif
}

cudaError_t wkv_backward_launch(int B, int T, int C, const float* w, const float* u,
                                const float* k, const float* v, const float* h0, const float* y,
                                const float* gy, float* gw, float* gu, float* gk, float* gv,
                                float* gh0, cudaStream_t stream) {
  const dim3 threadsPerBlock(C < 32 ? C : 32);
  const dim3 numBlocks(B * C / threadsPerBlock.x);
#ifdef GPUCHECK_ZOO_LEGACY_STREAM
  cudaError_t err = zoo_legacy_enter(stream);
  if (err != cudaSuccess) return err;
  kernel_backward<<<numBlocks, threadsPerBlock>>>(B, T, C, w, u, k, v, h0, y, gy, gw, gu, gk,
                                                  gv, gh0);  // Defect: the legacy stream
  err = cudaGetLastError();
  return err != cudaSuccess ? err : zoo_legacy_exit();
#else
  kernel_backward<<<numBlocks, threadsPerBlock, 0, stream>>>(B, T, C, w, u, k, v, h0, y, gy, gw,
                                                             gu, gk, gv, gh0);
  return cudaGetLastError();
#endif
}

}  // namespace TORCH_EXTENSION_NAME
