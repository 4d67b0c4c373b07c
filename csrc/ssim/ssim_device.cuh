// Device functions and constants shared by the SSIM kernels' forward (ssim_cuda.cu) and
// backward (ssim_backward.cu): the window, the accumulator type and conversions, the SSIM
// terms of four moments, the block sum, 16-byte shared loads and stores of 4 values, the
// 4-value horizontal filter and the fast division. See ssim_cuda.cu for the design.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ssim/ssim.h"

namespace gpucheck::ssim {
namespace {

constexpr int kHalf = 5;                       // window radius
constexpr int kWin = 2 * kHalf + 1;            // 11
constexpr int kMeanThreads = 256;


// The normalized 1-D Gaussian, sigma 1.5 (the 2-D window is its outer product).
__constant__ float kGaussF[kWin] = {
    0.00102838008447911f, 0.007598758135239185f, 0.03600077212843083f, 0.10936068950970002f,
    0.2130055377112537f,  0.26601172486179436f,  0.2130055377112537f,  0.10936068950970002f,
    0.03600077212843083f, 0.007598758135239185f, 0.00102838008447911f};
__constant__ double kGaussD[kWin] = {
    0.00102838008447911, 0.007598758135239185, 0.03600077212843083, 0.10936068950970002,
    0.2130055377112537,  0.26601172486179436,  0.2130055377112537,  0.10936068950970002,
    0.03600077212843083, 0.007598758135239185, 0.00102838008447911};

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename A>
__device__ __forceinline__ A gauss(int k);
template <>
__device__ __forceinline__ float gauss<float>(int k) { return kGaussF[k]; }
template <>
__device__ __forceinline__ double gauss<double>(int k) { return kGaussD[k]; }

// Explicit conversions (torch builds with __CUDA_NO_HALF_OPERATORS__ and friends).
__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_acc(acc_t<T> v);
template <>
__device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <>
__device__ __forceinline__ double from_acc<double>(double v) { return v; }
template <>
__device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Zero of the element type (torch builds with __CUDA_NO_HALF_CONVERSIONS__: no T(0) for the
// 16-bit types).
template <typename T>
__device__ __forceinline__ T zero() { return T(0); }
template <>
__device__ __forceinline__ __half zero<__half>() { return __ushort_as_half(0); }
template <>
__device__ __forceinline__ __nv_bfloat16 zero<__nv_bfloat16>() {
  return __ushort_as_bfloat16(0);
}

template <typename A>
struct SsimTerms {
  A a1, a2, b1, b2;
};

// m = (mu1, mu2, E[x² + y²], E[xy]) under the window.
template <typename A>
__device__ __forceinline__ SsimTerms<A> ssim_terms(const A (&m)[4]) {
  const A c1 = A(0.01 * 0.01);
  const A c2 = A(0.03 * 0.03);
  const A mu12 = m[0] * m[1];
  const A musq = fma(m[0], m[0], m[1] * m[1]);
  SsimTerms<A> t;
  t.a1 = fma(A(2), mu12, c1);
  t.a2 = fma(A(2), m[3] - mu12, c2);
  t.b1 = musq + c1;
  t.b2 = (m[2] - musq) + c2;
  return t;
}

// Deterministic block sum of kN threads (fixed shuffle tree, then warps in order); valid in
// thread 0.
template <int kN, typename A>
__device__ __forceinline__ A block_sum(A v) {
  static_assert(kN % 32 == 0, "whole warps");
  __shared__ A warp_sums[kN / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  A total = A(0);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < kN / 32; ++w) total += warp_sums[w];
  }
  return total;
}

struct TileGrid {
  int tiles_x;
  int tiles_y;
};

__host__ __device__ inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Multiprocessors of the current device (cached per device; 132 on an H200).
int multiprocessors() {
  constexpr int kMaxDevices = 64;
  static int cache[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 132;
  if (cache[dev] == 0) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        sms <= 0) {
      sms = 132;
    }
    cache[dev] = sms;
  }
  return cache[dev];
}

// 16-byte (float: 4 lanes; double: 2 x 2 lanes) load of 4 consecutive accumulator values
// from shared memory; `p` is 16-byte aligned.
__device__ __forceinline__ void load4(const float* p, float* v) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}
__device__ __forceinline__ void load4(const double* p, double* v) {
  const double2 a = *reinterpret_cast<const double2*>(p);
  const double2 b = *reinterpret_cast<const double2*>(p + 2);
  v[0] = a.x;
  v[1] = a.y;
  v[2] = b.x;
  v[3] = b.y;
}

// The 11-tap Gaussian filter at 4 consecutive outputs: out[i] = sum_t g[t] src[i + t], from 16
// values of shared memory read as four 16-byte loads (`src` is 16-byte aligned).
template <typename A>
__device__ __forceinline__ void filter4(const A* src, A* out) {
  A w[16];
#pragma unroll
  for (int q = 0; q < 4; ++q) load4(src + 4 * q, w + 4 * q);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    A acc = gauss<A>(0) * w[i];
#pragma unroll
    for (int t = 1; t < kWin; ++t) acc = fma(gauss<A>(t), w[i + t], acc);
    out[i] = acc;
  }
}

// Stores 4 consecutive map values; `p` is aligned to 4 elements.
__device__ __forceinline__ void store4(float* p, const float* v) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store4(double* p, const double* v) {
  reinterpret_cast<double2*>(p)[0] = make_double2(v[0], v[1]);
  reinterpret_cast<double2*>(p)[1] = make_double2(v[2], v[3]);
}
__device__ __forceinline__ void store4(__half* p, const float* v) {
  __half2 a = __floats2half2_rn(v[0], v[1]);
  __half2 b = __floats2half2_rn(v[2], v[3]);
  uint2 u;
  u.x = *reinterpret_cast<const unsigned*>(&a);
  u.y = *reinterpret_cast<const unsigned*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, const float* v) {
  __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]);
  __nv_bfloat162 b = __floats2bfloat162_rn(v[2], v[3]);
  uint2 u;
  u.x = *reinterpret_cast<const unsigned*>(&a);
  u.y = *reinterpret_cast<const unsigned*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}

template <typename A>
__device__ __forceinline__ A fast_div(A a, A b) { return a / b; }
template <>
__device__ __forceinline__ float fast_div<float>(float a, float b) { return __fdividef(a, b); }

// 1 / b: float uses the approximate hardware reciprocal (MUFU.RCP, <= 2 ulp; b >= C1 * C2 > 0)
// instead of the IEEE division's subroutine.
template <typename A>
__device__ __forceinline__ A fast_rcp(A b) { return A(1) / b; }
template <>
__device__ __forceinline__ float fast_rcp<float>(float b) { return __fdividef(1.0f, b); }

}  // namespace
}  // namespace gpucheck::ssim
