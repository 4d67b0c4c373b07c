// gpucheck's self-test zoo: the kernels of a distCUDA2 in the shape of simple-knn (Morton
// codes, a thrust sort, then the nearest neighbours of each point in the sorted order): the
// mean squared distance of every point to its 3 nearest neighbours. The neighbours are
// searched exhaustively (the result does not depend on the order; the sort is the
// convention). One source for the clean build and every defect build.
//   GPUCHECK_ZOO_THRUST_STREAM0  thrust::sort_by_key with thrust::device (stream 0) instead of
//                                thrust::cuda::par.on(stream)
#include "zoo_stream.cuh"

#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <cfloat>
#include <cstdint>

namespace TORCH_EXTENSION_NAME {
namespace {

__device__ uint32_t spread_bits(uint32_t v) {  // 10 bits -> every third of 30
  v = (v * 0x00010001u) & 0xFF0000FFu;
  v = (v * 0x00000101u) & 0x0F00F00Fu;
  v = (v * 0x00000011u) & 0xC30C30C3u;
  v = (v * 0x00000005u) & 0x49249249u;
  return v;
}

__global__ void morton_kernel(int n, const float* points, uint32_t* codes, uint32_t* order) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t code = 0;
  for (int d = 0; d < 3; ++d) {  // the unit cube [-2, 2]^3 on a 1024^3 grid
    const float t = fminf(fmaxf((points[3 * i + d] + 2.f) * 0.25f, 0.f), 1.f);
    code |= spread_bits(static_cast<uint32_t>(t * 1023.f)) << d;
  }
  codes[i] = code;
  order[i] = static_cast<uint32_t>(i);
}

__global__ void knn_kernel(int n, const float* points, const uint32_t* order, float* mean_dist) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const uint32_t i = order[k];
  const float x = points[3 * i], y = points[3 * i + 1], z = points[3 * i + 2];
  float best[3] = {FLT_MAX, FLT_MAX, FLT_MAX};
  for (int j = 0; j < n; ++j) {
    if (j == static_cast<int>(i)) continue;
    const float dx = points[3 * j] - x, dy = points[3 * j + 1] - y, dz = points[3 * j + 2] - z;
    const float d = dx * dx + dy * dy + dz * dz;
    if (d < best[2]) {
      if (d < best[1]) {
        best[2] = best[1];
        if (d < best[0]) {
          best[1] = best[0];
          best[0] = d;
        } else {
          best[1] = d;
        }
      } else {
        best[2] = d;
      }
    }
  }
  mean_dist[i] = (best[0] + best[1] + best[2]) / 3.f;
}

}  // namespace

// mean_dist [n]: n >= 4 points. Scratch from cudaMalloc (codes, order), freed on return.
cudaError_t dist_launch(int n, const float* points, float* mean_dist, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  uint32_t* codes = nullptr;
  uint32_t* order = nullptr;
  cudaError_t err = cudaMalloc(&codes, 2 * n * sizeof(uint32_t));
  if (err != cudaSuccess) return err;
  order = codes + n;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  morton_kernel<<<blocks, 256, 0, stream>>>(n, points, codes, order);
  err = cudaGetLastError();
  if (err == cudaSuccess) {
    thrust::device_ptr<uint32_t> keys(codes), values(order);
#ifdef GPUCHECK_ZOO_THRUST_STREAM0
    err = zoo_legacy_enter(stream);
    // Defect: thrust on the default stream (thrust::device), not on `stream`
    if (err == cudaSuccess) thrust::sort_by_key(thrust::device, keys, keys + n, values);
    if (err == cudaSuccess) err = zoo_legacy_exit();
#else
    thrust::sort_by_key(thrust::cuda::par.on(stream), keys, keys + n, values);
#endif
  }
  if (err == cudaSuccess) {
    knn_kernel<<<blocks, 256, 0, stream>>>(n, points, order, mean_dist);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  const cudaError_t freed = cudaFree(codes);
  return err != cudaSuccess ? err : freed;
}

}  // namespace TORCH_EXTENSION_NAME
