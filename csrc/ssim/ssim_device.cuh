// Device functions and constants shared by the SSIM kernels' forward (ssim_cuda.cu) and
// backward (ssim_backward.cu): the window, the accumulator type and conversions, the four
// filtered quantities and their vertical filter, the SSIM terms of the four moments, the cells
// of the mean, 16-byte shared loads and stores of 4 values, the 4-value horizontal filter and
// the reciprocal. See ssim_cuda.cu for the design.
//
// The forward and the backward kernel compute the same SSIM value at every map pixel, bit for
// bit, and add them up in the same order (the training step takes the mean from the backward
// kernel, inference from the forward kernel, and the two must agree): both use the helpers
// below, whose products and sums are written with intrinsics that the compiler neither
// contracts into FMAs nor reorders.
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

// The normalized 1-D Gaussian, sigma 1.5 (the 2-D window is its outer product), and twice it
// (exact: a power of two), the vertical weights of the xy moment (see vertical_filter).
__constant__ float kGaussF[kWin] = {
    0.00102838008447911f, 0.007598758135239185f, 0.03600077212843083f, 0.10936068950970002f,
    0.2130055377112537f,  0.26601172486179436f,  0.2130055377112537f,  0.10936068950970002f,
    0.03600077212843083f, 0.007598758135239185f, 0.00102838008447911f};
__constant__ double kGaussD[kWin] = {
    0.00102838008447911, 0.007598758135239185, 0.03600077212843083, 0.10936068950970002,
    0.2130055377112537,  0.26601172486179436,  0.2130055377112537,  0.10936068950970002,
    0.03600077212843083, 0.007598758135239185, 0.00102838008447911};
__constant__ float kGauss2F[kWin] = {
    2 * 0.00102838008447911f, 2 * 0.007598758135239185f, 2 * 0.03600077212843083f,
    2 * 0.10936068950970002f, 2 * 0.2130055377112537f,   2 * 0.26601172486179436f,
    2 * 0.2130055377112537f,  2 * 0.10936068950970002f,  2 * 0.03600077212843083f,
    2 * 0.007598758135239185f, 2 * 0.00102838008447911f};
__constant__ double kGauss2D[kWin] = {
    2 * 0.00102838008447911, 2 * 0.007598758135239185, 2 * 0.03600077212843083,
    2 * 0.10936068950970002, 2 * 0.2130055377112537,   2 * 0.26601172486179436,
    2 * 0.2130055377112537,  2 * 0.10936068950970002,  2 * 0.03600077212843083,
    2 * 0.007598758135239185, 2 * 0.00102838008447911};

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename A>
__device__ __forceinline__ A gauss(int k) {
  if constexpr (std::is_same_v<A, double>) return kGaussD[k];
  else return kGaussF[k];
}
template <typename A>
__device__ __forceinline__ A gauss2(int k) {
  if constexpr (std::is_same_v<A, double>) return kGauss2D[k];
  else return kGauss2F[k];
}

// Products, sums and differences the compiler must keep as written (never contracted into an
// FMA with a neighbouring operation: the two kernels must round alike).
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }

// `p`, hidden from the optimizer: a row loop then addresses its loads as this register pair
// plus a 32-bit offset (one multiply-add each) instead of rebuilding the address from the
// kernel's parameters at every load.
template <typename T>
__device__ __forceinline__ const T* opaque(const T* p) {
  const T* q;
  asm("mov.b64 %0, %1;" : "=l"(q) : "l"(p));
  return q;
}

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

// SSIM's constants, C1 = 0.01², C2 = 0.03².
template <typename A>
constexpr A kC1 = A(0.01 * 0.01);
template <typename A>
constexpr A kC2 = A(0.03 * 0.03);

// The four quantities of an input pixel that the window filters: x, y, x² + y², xy (only the
// sum sigma1² + sigma2² enters SSIM, so x² and y² are filtered together).
template <typename A>
__device__ __forceinline__ void quantities(A x, A y, A (&q)[4]) {
  q[0] = x;
  q[1] = y;
  q[2] = fma(x, x, mul(y, y));
  q[3] = mul(x, y);
}

// The vertical 11-tap filter of the four quantities held in ring slots kFirst, kFirst + 1, ...
// (mod the ring's size; the oldest row first). The filtered moments come out in SSIM's "folded"
// form (see ssim_terms): G*x, G*y, G*(x² + y²) + C1 + C2 and 2 G*(xy) + C2. The constants ride
// on the first tap's multiply (an FMA instead of a product: no extra instruction) and pass the
// horizontal filter, whose weights sum to 1; the factor 2 is in the weights (exact).
template <int kFirst, typename A, int kN>
__device__ __forceinline__ void vertical_filter(const A (&ring)[kN][4], A (&v)[4]) {
  constexpr int s0 = kFirst % kN;
  v[0] = mul(gauss<A>(0), ring[s0][0]);
  v[1] = mul(gauss<A>(0), ring[s0][1]);
  v[2] = fma(gauss<A>(0), ring[s0][2], kC1<A> + kC2<A>);
  v[3] = fma(gauss2<A>(0), ring[s0][3], kC2<A>);
#pragma unroll
  for (int k = 1; k < kWin; ++k) {
    const int s = (kFirst + k) % kN;
    v[0] = fma(gauss<A>(k), ring[s][0], v[0]);
    v[1] = fma(gauss<A>(k), ring[s][1], v[1]);
    v[2] = fma(gauss<A>(k), ring[s][2], v[2]);
    v[3] = fma(gauss2<A>(k), ring[s][3], v[3]);
  }
}

template <typename A>
struct SsimTerms {
  A a1, a2, b1, b2;
};

// SSIM = a1 a2 / (b1 b2) from the folded moments m = (mu1, mu2, E[x² + y²] + C1 + C2,
// 2 E[xy] + C2) (vertical_filter, then the horizontal filter): a1 = 2 mu1 mu2 + C1,
// a2 = 2 sigma12 + C2 = m[3] - 2 mu1 mu2, b1 = mu1² + mu2² + C1,
// b2 = sigma1² + sigma2² + C2 = m[2] - b1. Six operations.
template <typename A>
__device__ __forceinline__ SsimTerms<A> ssim_terms(const A (&m)[4]) {
  const A mu12 = mul(m[0], m[1]);
  SsimTerms<A> t;
  t.a1 = fma(A(2), mu12, kC1<A>);
  t.a2 = fma(A(-2), mu12, m[3]);
  t.b1 = fma(m[0], m[0], fma(m[1], m[1], kC1<A>));
  t.b2 = sub(m[2], t.b1);
  return t;
}

// 1 / b: float uses the approximate hardware reciprocal (MUFU.RCP, <= 1 ulp; b >= C1 C2 > 0,
// a normal number) with no range fix-up, double the IEEE division.
__device__ __forceinline__ float fast_rcp(float b) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  return r;
}
__device__ __forceinline__ double fast_rcp(double b) { return 1.0 / b; }

// 1 / (b1 b2), and the SSIM value (a1 a2) / (b1 b2) from it.
template <typename A>
__device__ __forceinline__ A ssim_inverse(const SsimTerms<A>& t) {
  return fast_rcp(mul(t.b1, t.b2));
}
template <typename A>
__device__ __forceinline__ A ssim_value(const SsimTerms<A>& t, A inv) {
  return mul(mul(t.a1, t.a2), inv);
}

// The cells of the mean. The map is summed per cell of kCellRows x kCellCols pixels, in window
// centre (image) coordinates shifted by kCellShift = -5: cell (band, seg) holds the map pixels
// centred on image rows 16 band - 5 .. 16 band + 10 and columns 116 seg - 5 .. 116 seg + 110
// (pixels outside the map count as zero; the shift puts the backward kernel's own groups of
// partial pixels on the cells' groups), and its sum is formed in one fixed order. Lane
// l = 29 b + g (b < 4, g < 29) of four warps holds, for each batch q (rows 4q .. 4q + 3 of the
// cell), s_q = ((v0 + v1) + (v2 + v3)) of the 4 pixels of row b, columns 4 g .. 4 g + 3, and
// adds them up as ((s_0 + s_1) + (s_2 + s_3)) (CellLane); warp_tree sums each warp; the cell
// is ((w0 + w1) + (w2 + w3)) (cell_sum). The forward kernel's tiles are one cell wide and 4
// cells tall, the backward kernel's two cells wide and any number of cells tall; both form each
// cell this way and the mean is the sum of all cells in a fixed order (ssim_mean_kernel), so it
// does not depend on which kernel computed it.
constexpr int kCellShift = -5;
constexpr int kBatchRows = 4;               // rows of a batch (both kernels)
constexpr int kCellBatches = 4;
constexpr int kCellRows = kCellBatches * kBatchRows;  // 16
constexpr int kCellGroups = 29;
constexpr int kCellCols = 4 * kCellGroups;  // 116
constexpr int kCellWarps = 4;               // 128 lanes, 116 of them used

__host__ __device__ inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Cells of the mean per plane: bands (rows) and segments (columns), over every window centre
// of the image.
struct CellGrid {
  int bands;
  int segs;
};
inline CellGrid cell_grid(const Geometry& g) {
  return {ceil_div(g.height - kCellShift, kCellRows), ceil_div(g.width - kCellShift, kCellCols)};
}

// Sum of the 32 lanes' values in a fixed order (shuffle tree); valid in lane 0.
template <typename A>
__device__ __forceinline__ A warp_tree(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = add(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

// One lane's share of a cell, batch by batch: add<q>(s) for q = 0, 1, 2, 3 (the batch within
// the cell; every thread of the block calls it for every batch); after q = 3 the warps' sums
// are in `wsum[0..3]` (lane 0 of each of the cell's four warps writes its own; `warp` < 4 is
// the thread's warp within the cell). add(q, s) when q is known only at run time.
template <typename A>
struct CellLane {
  A s01 = A(0);
  A s2 = A(0);
  template <int kQ>
  __device__ __forceinline__ void add(A s, A* wsum, int warp) {
    if constexpr (kQ == 0) {
      s01 = s;
    } else if constexpr (kQ == 1) {
      s01 = ::gpucheck::ssim::add(s01, s);
    } else if constexpr (kQ == 2) {
      s2 = s;
    } else {
      const A w = warp_tree(::gpucheck::ssim::add(s01, ::gpucheck::ssim::add(s2, s)));
      if ((threadIdx.x & 31) == 0) wsum[warp] = w;
    }
  }
  __device__ __forceinline__ void add(int q, A s, A* wsum, int warp) {
    if (q == 0) {
      add<0>(s, wsum, warp);
    } else if (q == 1) {
      add<1>(s, wsum, warp);
    } else if (q == 2) {
      add<2>(s, wsum, warp);
    } else {
      add<3>(s, wsum, warp);
    }
  }
};

// A cell's sum from its four warp sums.
template <typename A>
__device__ __forceinline__ A cell_sum(const A* w) {
  return add(add(w[0], w[1]), add(w[2], w[3]));
}

struct TileGrid {
  int tiles_x;
  int tiles_y;
};

// Multiprocessors of the current device (cached per device; 132 on an H100/H200).
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

// Kernels with more than 48 KiB of dynamic shared memory need the attribute raised first.
template <typename Kernel>
cudaError_t prepare(Kernel kernel, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem));
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
    A acc = mul(gauss<A>(0), w[i]);
#pragma unroll
    for (int t = 1; t < kWin; ++t) acc = fma(gauss<A>(t), w[i + t], acc);
    out[i] = acc;
  }
}

// Stores 4 consecutive values; `p` is aligned to 4 elements.
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

}  // namespace
}  // namespace gpucheck::ssim
