// Fused SSIM kernels: forward (map or per-block sums) and backward (recomputing), plus the
// deterministic second stage of the mean.
//
// Only four windowed moments enter SSIM: mu1 = G*x, mu2 = G*y, G*(x² + y²) (the two variances
// appear only as their sum) and G*(xy). Out-of-image pixels read as zero (zero padding), so
// tiles need not divide the image.
//
// Forward: vertical pass first, in registers, one input column per thread, rows streamed
// straight from global memory; horizontal pass from shared memory, 4 map columns per thread
// with 16-byte shared loads. See ssim_forward_kernel.
//
// Backward: the forward's layout twice over, in batches of 4 rows: moments vertically in a
// register ring, horizontally from shared memory (16-byte loads), the four weighted partials
// into a shared ring of rows, then the partials vertically (4 rows per thread from that ring)
// and horizontally (16-byte loads), and the gradient. See ssim_backward_kernel.
//
// Backward math. With zero padding the window is symmetric, so the adjoint of the filter is
// the filter itself. For a loss L = sum_p g(p) S(p), with the moments mu1 = G*x, mu2 = G*y,
// mxx = G*x², myy = G*y², mxy = G*xy (SSIM depends on mxx, myy only through mxx + myy):
//   dL/dx = G*(g dS/dmu1) + 2 x G*(g dS/dmxx) + y G*(g dS/dmxy)
//   dL/dy = G*(g dS/dmu2) + 2 y G*(g dS/dmyy) + x G*(g dS/dmxy),   dS/dmxx = dS/dmyy.
// The backward kernel recomputes the moments on a halo of 5 around its tile, forms the four
// weighted partials there in shared memory (zero outside the map), and filters them a second
// time. Recomputing instead of saving the partials in the forward costs arithmetic (about a
// forward pass) but no memory: saving four float32 maps would cost 16 bytes per pixel of
// memory (475 MiB at 5x3x1080x1920) and 32 bytes per pixel of traffic (write + read),
// about as much time as the recomputation.
//
// Determinism: no atomics. With reduction = mean each block writes its sum (fixed shuffle
// tree) and one block adds the partials in a fixed order in float64.
//
// Also here: the in-place scale of a gradient computed ahead (ssim_scale_kernel).
#include "ssim/ssim.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

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

// Forward (vertical pass first, then horizontal).
//
// Block = (plane, strip of kFStrip map rows, kFCols map columns), kFT threads. The SSIM map
// needs four windowed moments: mu1 = G*x, mu2 = G*y, G*(x² + y²) and G*(xy) (only the sum
// sigma1² + sigma2² enters SSIM, so x² and y² are filtered together).
//   * Vertical: thread t owns input column c0 - 5 + t (kFCols + 10 <= kFT columns), streams
//     the strip's rows (plus the 5-row halo) straight from global memory (coalesced across
//     the warp; rows are prefetched kFPre rows ahead into registers), keeps the four
//     quantities of the last kFRing rows in a register ring (row t in slot t % kFRing; the
//     row loop is unrolled by kFRing so every slot index is a compile-time constant) and
//     writes the vertically filtered row to shared memory.
//   * Horizontal: every kFBatch map rows, thread (b, g) of kFBatch x kFGroups filters map row
//     b, columns 4g..4g+3, reading 16 values per moment with four 16-byte shared loads, and
//     writes 4 map values (or adds them to its sum).
// Double-buffered shared rows: one barrier per kFBatch map rows. Blocks away from the top and
// bottom image edges stream their rows without row bounds checks (forward_rows<kInside>).
// No bounds checks inside the filters: out-of-image rows/columns are loaded as zero (zero
// padding).
// Blocks of 128 threads, 116 map columns (29 groups of 4). GPUCHECK_SSIM_FWIDE=1 builds wide
// blocks for float32 and 16-bit instead (float64's double-buffered rows would pass the 48 KiB
// of static shared memory): 256 threads, 244 columns (61 groups), 2 blocks per SM. Measured
// on H200 (2026-11-24, fp32): 5x3x1080x1920 forward 0.217 -> 0.211 ms (4.8 % fewer
// instructions: fewer idle lanes and halo columns), but 5x1x1500x1500 0.083 -> 0.096 ms (7
// tiles of 244 columns waste 14 % of 1708, and 840 blocks fill 3.2 waves of 264): off.
#ifndef GPUCHECK_SSIM_FWIDE
#define GPUCHECK_SSIM_FWIDE 0
#endif
template <typename T>
constexpr int kFT = GPUCHECK_SSIM_FWIDE && !std::is_same_v<T, double> ? 256 : 128;
template <typename T>
constexpr int kFCols = kFT<T> - 12;            // map columns per block (244 or 116)
template <typename T>
constexpr int kFGroups = kFCols<T> / 4;        // 61 or 29
constexpr int kFBatch = 4;                     // map rows per horizontal pass
constexpr int kFRing = 12;                     // ring slots: >= 11, multiple of kFBatch
// Tuning knobs (defaults measured best on H200, 2026-11-21, fp32 5x3x1080x1920: forward
// strip 32 -> 64 rows 5 % faster, 96 no better (and 16 % slower at 1x3x1080x1920); 4 -> 5
// forward blocks/SM (96 registers, spills) 10 % slower; third version: register prefetch
// 12 -> 6 rows ahead 2 % faster (116 instead of 124 registers, fewer rematerialized
// addresses), launch bound 4 -> 3 blocks/SM 0.5-2 % faster (same registers). Backward (its
// second layout, 2026-11-24): 4 blocks/SM at 128 registers without spills.
#ifndef GPUCHECK_SSIM_FSTRIP
#define GPUCHECK_SSIM_FSTRIP 64
#endif
#ifndef GPUCHECK_SSIM_FBLOCKS
#define GPUCHECK_SSIM_FBLOCKS 3
#endif
#ifndef GPUCHECK_SSIM_BBLOCKS
#define GPUCHECK_SSIM_BBLOCKS 4
#endif
#ifndef GPUCHECK_SSIM_FPRE
#define GPUCHECK_SSIM_FPRE 6
#endif
// 16-bit images: measured on H200 (2026-11-24, forward + mean, 6 -> 12 rows): bfloat16
// 5x3x1080x1920 0.249-0.254 -> 0.242-0.244 ms, 1x3x1080x1920 0.069-0.072 -> 0.068-0.070,
// 5x1x1500x1500 0.097-0.098 -> 0.095 (134 registers: 3 blocks per SM instead of 4, but twice
// the loads in flight: ncu measured 3.5x float32's long-scoreboard stalls per instruction in
// the 16-bit forward with 6 rows); float32 with 12 rows is 7-9 % slower (136 registers), so it
// keeps 6. Converting 16-bit rows when loaded instead of when used puts the wait right after
// the load: 0.338 ms.
#ifndef GPUCHECK_SSIM_FPRE16
#define GPUCHECK_SSIM_FPRE16 12
#endif
constexpr int kFStrip = GPUCHECK_SSIM_FSTRIP;
// Rows of register prefetch ahead of the row being filtered (divides kFRing).
template <typename T>
constexpr int kFPre = sizeof(T) == 2 ? GPUCHECK_SSIM_FPRE16 : GPUCHECK_SSIM_FPRE;
constexpr int kFStream = kFStrip + 2 * kHalf;  // input rows streamed per block (42)
template <typename T>
constexpr int kFPitch = kFT<T>;                // shared row pitch (columns)
template <typename T>
constexpr bool fwd_shape_ok() {
  return kFCols<T> + 2 * kHalf <= kFT<T> &&          // one input column per thread
         kFGroups<T> * kFBatch <= kFT<T> &&          // one horizontal group per thread
         4 * (kFGroups<T> - 1) + 16 <= kFPitch<T>;  // 16-value reads stay in the row
}
static_assert(fwd_shape_ok<float>() && fwd_shape_ok<double>(), "forward block shape");
static_assert(kFRing % kFBatch == 0 && kFRing >= kWin && kFStrip % kFBatch == 0, "ring");
static_assert(kFRing % kFPre<float> == 0 && kFRing % kFPre<__half> == 0,
              "prefetch slot of a ring slot is a compile-time constant");

template <typename T>
TileGrid forward_grid(const Geometry& g) {
  return {ceil_div(g.out_width(), kFCols<T>), ceil_div(g.out_height(), kFStrip)};
}

// float/half/bf16: <= 128 registers (2 wide or 4 narrow blocks = 16 warps per SM); float64
// needs twice the registers for the same ring.
template <typename T>
constexpr int kFMinBlocks = std::is_same_v<T, double> ? 2
                            : kFT<T> == 256            ? 2
                                                       : GPUCHECK_SSIM_FBLOCKS;

// The streamed-row loop of the forward kernel (see ssim_forward_kernel). kInside: every
// fetched row (ri0 .. ri0 + kFStream + kFPre - 1) lies inside the image and the plane has
// < 2^31 pixels, so a fetch is one 32-bit offset add and two loads (predicated on the
// loop-invariant col_in); otherwise each fetch checks its row.
template <typename T, bool kMean, bool kInside>
__device__ __forceinline__ void forward_rows(const T* __restrict__ xcol,
                                             const T* __restrict__ ycol, bool col_in, int ri0,
                                             int height, int width, int out_h, int out_w,
                                             int o_row0, int tid, int hb, int hg, bool h_on,
                                             int h_col, bool h_vec, T* __restrict__ map_plane,
                                             acc_t<T> (&vrows)[2][kFBatch][4][kFPitch<T>],
                                             acc_t<T>& sum) {
  using A = acc_t<T>;
  // Prefetched rows as raw elements, converted when used (see ChunkLoader).
  T px[kFPre<T>];
  T py[kFPre<T>];
  // kInside: element offset of the next row to fetch (row ri0 + t + kFPre after the
  // prologue), relative to the column pointers.
  int off = ri0 * width;
  auto fetch = [&](int t, T& vx, T& vy) {
    vx = zero<T>();
    vy = zero<T>();
    if constexpr (kInside) {
      if (col_in) {
        vx = xcol[off];
        vy = ycol[off];
      }
      off += width;
    } else {
      const int r = ri0 + t;
      if (col_in && t < kFStream && static_cast<unsigned>(r) < static_cast<unsigned>(height)) {
        const int64_t idx = static_cast<int64_t>(r) * width;
        vx = xcol[idx];
        vy = ycol[idx];
      }
    }
  };
#pragma unroll
  for (int u = 0; u < kFPre<T>; ++u) fetch(u, px[u], py[u]);

  A ring[kFRing][4];
#pragma unroll 1
  for (int c = 0; c * kFRing < kFStream; ++c) {
    // Map row o = c * kFRing + u - 10 belongs to batch o / kFBatch, whose shared buffer is
    // ((c + 1) + (u + 2) / kFBatch) & 1 (kFRing = 3 kFBatch): two base pointers per
    // iteration instead of index arithmetic per row.
    const int par = (c + 1) & 1;
    A* const vbase[2] = {&vrows[par][0][0][tid], &vrows[par ^ 1][0][0][tid]};
    const A* const hbase[2] = {&vrows[par][hb][0][4 * hg], &vrows[par ^ 1][hb][0][4 * hg]};
#pragma unroll
    for (int u = 0; u < kFRing; ++u) {
      const int t = c * kFRing + u;  // streamed row; ring slot u
      if (t < kFStream) {
        const A xv = to_acc(px[u % kFPre<T>]);
        const A yv = to_acc(py[u % kFPre<T>]);
        fetch(t + kFPre<T>, px[u % kFPre<T>], py[u % kFPre<T>]);
        ring[u][0] = xv;
        ring[u][1] = yv;
        ring[u][2] = fma(xv, xv, yv * yv);
        ring[u][3] = xv * yv;
        if (t >= 2 * kHalf) {  // map row o = t - 10 has rows t-10..t in the ring
          const int o = t - 2 * kHalf;
          A v[4];
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            v[m] = gauss<A>(0) * ring[(u + kFRing - 2 * kHalf) % kFRing][m];
          }
#pragma unroll
          for (int k = 1; k < kWin; ++k) {
            const int slot = (u + kFRing - 2 * kHalf + k) % kFRing;
#pragma unroll
            for (int m = 0; m < 4; ++m) v[m] = fma(gauss<A>(k), ring[slot][m], v[m]);
          }
          static_assert(kFRing == 3 * kFBatch, "buffer parity formula");
          const int bsel = ((u + 2) / kFBatch) & 1;
          const int kRowInBatch = (u + kFRing - 2 * kHalf) % kFBatch;  // o % kFBatch
#pragma unroll
          for (int m = 0; m < 4; ++m) vbase[bsel][(kRowInBatch * 4 + m) * kFPitch<T>] = v[m];
          if (kRowInBatch == kFBatch - 1) {  // batch complete
            __syncthreads();
            const int o_row = o_row0 + o - (kFBatch - 1) + hb;
            if (h_on && o_row < out_h) {
              A mom[4][4];  // [moment][pixel]
#pragma unroll
              for (int m = 0; m < 4; ++m) filter4(hbase[bsel] + m * kFPitch<T>, mom[m]);
              A val[4];
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const A c1 = A(0.01 * 0.01);
                const A c2 = A(0.03 * 0.03);
                const A mu12 = mom[0][i] * mom[1][i];
                const A musq = fma(mom[0][i], mom[0][i], mom[1][i] * mom[1][i]);
                const A a1 = fma(A(2), mu12, c1);
                const A a2 = fma(A(2), mom[3][i] - mu12, c2);
                const A b1 = musq + c1;
                const A b2 = (mom[2][i] - musq) + c2;
                val[i] = fast_div<A>(a1 * a2, b1 * b2);
              }
              if constexpr (kMean) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                  if (h_col + i < out_w) sum += val[i];
                }
              } else {
                T* dst = map_plane + static_cast<int64_t>(o_row) * out_w + h_col;
                if (h_vec) {
                  store4(dst, val);
                } else {
#pragma unroll
                  for (int i = 0; i < 4; ++i) {
                    if (h_col + i < out_w) dst[i] = from_acc<T>(val[i]);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

template <typename T, bool kMean>
__global__ void __launch_bounds__(kFT<T>, kFMinBlocks<T>)
    ssim_forward_kernel(const T* __restrict__ img1,  // [planes, H, W]
                        const T* __restrict__ img2,  // [planes, H, W]
                        int height, int width, int out_h, int out_w, int offset, int tiles_x,
                        int tiles_y,
                        T* __restrict__ map,               // [planes, out_h, out_w] or null
                        acc_t<T>* __restrict__ partials) {  // [blocks] or null
  using A = acc_t<T>;
  // [buffer][map row in batch][moment][column]
  __shared__ __align__(16) A vrows[2][kFBatch][4][kFPitch<T>];
#ifdef GPUCHECK_DEFECT_SHARED_OOB
  // Deliberate defect for the sanitizer self-test (issue 9): thread 0 of every block writes
  // an element 64 elements past the end of vrows, i.e. past the end of the block's shared
  // memory whatever the order of its static arrays (block_sum's warp_sums is 4 or 8
  // elements), so compute-sanitizer memcheck reports an invalid __shared__ write. Never define
  // it in a release build.
  if (threadIdx.x == 0) {
    volatile A* past_end = &vrows[0][0][0][0] + 2 * kFBatch * 4 * kFPitch<T> + 64;
    *past_end = A(0);
  }
#endif

  const int64_t block = blockIdx.x;
  const int tx = static_cast<int>(block % tiles_x);
  const int64_t rest = block / tiles_x;
  const int ty = static_cast<int>(rest % tiles_y);
  const int64_t plane = rest / tiles_y;
  const int o_col0 = tx * kFCols<T>;
  const int o_row0 = ty * kFStrip;
  const int tid = threadIdx.x;

  // Vertical role: input column ci, rows from ri0.
  const int64_t plane_px = static_cast<int64_t>(height) * width;
  const int ci = o_col0 + offset - kHalf + tid;
  const bool col_in = ci >= 0 && ci < width;
  const T* xcol = img1 + plane * plane_px + (col_in ? ci : 0);
  const T* ycol = img2 + plane * plane_px + (col_in ? ci : 0);
  const int ri0 = o_row0 + offset - kHalf;

  // Horizontal role: map row b of each batch, map columns o_col0 + 4g .. + 3.
  const int hb = tid / kFGroups<T>;
  const int hg = tid - hb * kFGroups<T>;
  const bool h_on = tid < kFGroups<T> * kFBatch;
  const int h_col = o_col0 + 4 * hg;
  const bool h_vec = !kMean && (out_w % 4 == 0) && h_col + 3 < out_w;
  T* map_plane = kMean ? nullptr : map + plane * (static_cast<int64_t>(out_h) * out_w);
  A sum = A(0);
  // Rows ri0 .. ri0 + kFStream - 1 are streamed; the register prefetch runs kFPre rows ahead
  // of the row being filtered. Blocks whose streamed and prefetched rows all lie inside the
  // image (all but the top and bottom strips) take the unchecked path: no row bounds checks,
  // the row address advanced by one add. Out-of-image columns (col_in false: a per-thread,
  // loop-invariant predicate) read as zero on both paths.
  const bool rows_inside = ri0 >= 0 && ri0 + kFStream + kFPre<T> <= height &&
                           plane_px <= static_cast<int64_t>(0x7fffffff);
  if (rows_inside) {
    forward_rows<T, kMean, true>(xcol, ycol, col_in, ri0, height, width, out_h, out_w, o_row0,
                                 tid, hb, hg, h_on, h_col, h_vec, map_plane, vrows, sum);
  } else {
    forward_rows<T, kMean, false>(xcol, ycol, col_in, ri0, height, width, out_h, out_w, o_row0,
                                  tid, hb, hg, h_on, h_col, h_vec, map_plane, vrows, sum);
  }
  if constexpr (kMean) {
    const A total = block_sum<kFT<T>>(sum);
    if (threadIdx.x == 0) partials[block] = total;
  }
}

// Backward, in the forward's layout. Block = (plane, strip of `strip_rows` gradient rows,
// kBCols gradient columns), kBT threads; everything moves in batches of kBBatch rows, with
// two barriers per batch:
//   1. moments, vertical pass (thread t owns input column c0 - 10 + t): rows streamed from
//      global memory (prefetched kBPre rows ahead), the last 11 rows' x, y, x² + y², xy in a
//      register ring, the vertically filtered batch written to `vbuf`;
//   2. moments, horizontal pass (thread (b, g): row b of the batch, partial columns
//      4g .. 4g + 3, 16-byte shared loads), then the four weighted partials g dS/dmoment of
//      those 4 pixels (zero outside the map), written to `pring`, a ring of kBPRows rows;
//   3. partials, vertical pass (thread t owns partial column t), 4 gradient rows at once from
//      the 14 partial rows they need, written to `v2`;
//   4. partials, horizontal pass (thread (b, g): gradient row b of the batch, columns
//      4g .. 4g + 3), then the gradient from the images at those pixels.
// Iteration k runs 1 on batch k, barrier, 2 on batch k and 4 on gradient batch k - 4,
// barrier, 3 on gradient batch k - 3. Streamed row s is image row r0 - 10 + s, partial row p
// image row r0 - 5 + p, gradient row q image row r0 + q.
constexpr int kBT = 128;                        // threads per block
constexpr int kBCols = 104;                     // gradient columns per block (26 groups of 4)
constexpr int kBGroups = kBCols / 4;            // 26
constexpr int kBPCols = 116;                    // partial columns (>= kBCols + 10; 29 groups)
constexpr int kBPGroups = kBPCols / 4;          // 29
constexpr int kBInCols = kBPCols + 2 * kHalf;   // 126 input columns
constexpr int kBBatch = 4;                      // rows per batch
constexpr int kBRing = 12;                      // register ring slots (3 batches)
constexpr int kBPre = 4;                        // rows of register prefetch
constexpr int kBPRows = 16;                     // shared ring of partial rows
constexpr int kBPitch = 128;                    // shared row pitch (columns)
constexpr int kBBufElems = kBBatch * 4 * kBPitch;               // vbuf and v2
constexpr int kBSmemElems = 2 * kBBufElems + kBPRows * 4 * kBPitch;
static_assert(kBInCols <= kBT, "one input column per thread");
static_assert(kBPCols >= kBCols + 2 * kHalf && kBPCols <= kBT, "partials of the gradient tile");
static_assert(kBPGroups * kBBatch <= kBT && kBGroups * kBBatch <= kBT, "one group per thread");
static_assert(4 * (kBPGroups - 1) + 16 <= kBPitch, "16-value reads stay in the row");
static_assert(4 * (kBGroups - 1) + 16 <= kBPCols, "16-value reads stay in the partials");
static_assert(kBRing == 3 * kBBatch && kBBatch % kBPre == 0, "ring slots");
static_assert(kBPRows == 4 * kBBatch, "partial ring: 4 batches, slot of stage 3 per jb % 4");

// float/half/bf16: <= 128 registers (4 blocks = 16 warps per SM); float64: twice the ring.
template <typename T>
constexpr int kBMinBlocks = std::is_same_v<T, double> ? 1 : GPUCHECK_SSIM_BBLOCKS;

// 4 consecutive elements, loaded at once (16 bytes for float32); `p` aligned to 4 elements.
template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

template <typename T, bool kScalarGrad>
__global__ void __launch_bounds__(kBT, kBMinBlocks<T>)
    ssim_backward_kernel(const T* __restrict__ grad,  // [1], [planes, out_h, out_w] or null
                         acc_t<T> scale,
                         const T* __restrict__ img1,  // [planes, H, W]
                         const T* __restrict__ img2,  // [planes, H, W]
                         int height, int width, int out_h, int out_w, int offset, int tiles_x,
                         int tiles_y, int strip_rows,
                         T* __restrict__ grad1,   // [planes, H, W]
                         T* __restrict__ grad2) {  // [planes, H, W] or null
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* const vbuf = reinterpret_cast<A*>(smem_raw);  // [kBBatch][4 moments][kBPitch]
  A* const v2 = vbuf + kBBufElems;                 // [kBBatch][4 partials][kBPitch]
  A* const pring = v2 + kBBufElems;                // [kBPRows][4 partials][kBPitch]

  const int64_t block = blockIdx.x;
  const int tx = static_cast<int>(block % tiles_x);
  const int64_t rest = block / tiles_x;
  const int ty = static_cast<int>(rest % tiles_y);
  const int64_t plane = rest / tiles_y;
  const int c0 = tx * kBCols;
  const int r0 = ty * strip_rows;
  const int tid = threadIdx.x;
  const int64_t plane_px = static_cast<int64_t>(height) * width;
  const T* const x = img1 + plane * plane_px;
  const T* const y = img2 + plane * plane_px;

  // Role 1: input column ci.
  const int ci = c0 - 2 * kHalf + tid;
  const bool col_in = tid < kBInCols && ci >= 0 && ci < width;
  const T* const xcol = x + (col_in ? ci : 0);
  const T* const ycol = y + (col_in ? ci : 0);
  // Role 2: row hb of a batch, partial columns 4 hg .. (map column of the first: pmc0).
  const int hb = tid / kBPGroups;
  const int hg = tid - hb * kBPGroups;
  const bool on2 = tid < kBPGroups * kBBatch;
  const int pmc0 = c0 - kHalf + 4 * hg - offset;
  // Role 3: partial column tid. Role 4: gradient row gb of a batch, columns gcol ...
  const bool on3 = tid < kBPCols;
  const int gb = tid / kBGroups;
  const int gg = tid - gb * kBGroups;
  const bool on4 = tid < kBGroups * kBBatch;
  const int gcol = c0 + 4 * gg;
  // 4-element accesses: rows of whole groups and 4-element aligned tensors (an input may be
  // a view with any storage offset).
  constexpr uintptr_t kMisaligned = 4 * sizeof(T) - 1;
  const bool aligned = ((reinterpret_cast<uintptr_t>(img1) | reinterpret_cast<uintptr_t>(img2) |
                         reinterpret_cast<uintptr_t>(grad1) | reinterpret_cast<uintptr_t>(grad2)) &
                        kMisaligned) == 0;
  const bool g_vec = aligned && width % 4 == 0 && gcol + 3 < width;
  const bool need2 = grad2 != nullptr;

  const T* const grad_plane =
      kScalarGrad ? grad : grad + plane * (static_cast<int64_t>(out_h) * out_w);
  A g_scalar = scale;
  if (kScalarGrad && grad != nullptr) g_scalar = to_acc(grad[0]) * scale;

  // Rows are fetched in order: fr = image row of the next fetch, foff its offset.
  int fr = r0 - 2 * kHalf;
  int64_t foff = static_cast<int64_t>(fr) * width;
  auto fetch = [&](T& vx, T& vy) {
    vx = zero<T>();
    vy = zero<T>();
    if (col_in && static_cast<unsigned>(fr) < static_cast<unsigned>(height)) {
      vx = xcol[foff];
      vy = ycol[foff];
    }
    ++fr;
    foff += width;
  };
  T px[kBPre];  // raw elements, converted when used (see the forward)
  T py[kBPre];
#pragma unroll
  for (int u = 0; u < kBPre; ++u) fetch(px[u], py[u]);
  A ring[kBRing][4];
  // Streamed row s into ring slot s % kBRing; prefetch slot s % kBPre.
  auto push = [&](int slot, int pre) {
    const A xv = to_acc(px[pre]);
    const A yv = to_acc(py[pre]);
    fetch(px[pre], py[pre]);
    ring[slot][0] = xv;
    ring[slot][1] = yv;
    ring[slot][2] = fma(xv, xv, yv * yv);
    ring[slot][3] = xv * yv;
  };
#pragma unroll
  for (int s = 0; s < 2 * kHalf; ++s) push(s, s % kBPre);
  // Stage 1 of batch k (rows 10 + 4k + i): ring slots (10 + 4k + i) % 12, a compile-time
  // constant for each value of k % 3.
  auto stage1 = [&](auto kc) {
    constexpr int kC = decltype(kc)::value;
#pragma unroll
    for (int i = 0; i < kBBatch; ++i) {
      constexpr int kS0 = 2 * kHalf + kBBatch * kC;  // (10 + 4k) mod 12
      const int slot = (kS0 + i) % kBRing;
      push(slot, (2 * kHalf + i) % kBPre);
      A v[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) v[m] = gauss<A>(0) * ring[(slot + 2) % kBRing][m];
#pragma unroll
      for (int k = 1; k < kWin; ++k) {
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          v[m] = fma(gauss<A>(k), ring[(slot + 2 + k) % kBRing][m], v[m]);
        }
      }
#pragma unroll
      for (int m = 0; m < 4; ++m) vbuf[(i * 4 + m) * kBPitch + tid] = v[m];
    }
  };

  // Stage 3 of gradient batch jb, whose first partial row sits in ring slot 4 (jb % 4): every
  // slot a compile-time constant.
  auto stage3 = [&](auto jc) {
    constexpr int kBase = kBBatch * decltype(jc)::value;
    const A* col = pring + tid;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      A acc[kBBatch];
#pragma unroll
      for (int i = 0; i < kBBatch + 2 * kHalf; ++i) {
        const A v = col[(((kBase + i) & (kBPRows - 1)) * 4 + q) * kBPitch];
#pragma unroll
        for (int r = 0; r < kBBatch; ++r) {
          const int t = i - r;
          if (t == 0) acc[r] = gauss<A>(0) * v;
          if (t > 0 && t < kWin) acc[r] = fma(gauss<A>(t), v, acc[r]);
        }
      }
#pragma unroll
      for (int r = 0; r < kBBatch; ++r) v2[(r * 4 + q) * kBPitch + tid] = acc[r];
    }
  };

  const int batches = strip_rows / kBBatch;  // gradient batches
  const int last1 = batches + 3;             // stages 1, 2 run for k < last1
  int kc = 0;                                // k % 3
#pragma unroll 1
  for (int k = 0; k < batches + 4; ++k) {
    if (k < last1) {
      if (kc == 0) {
        stage1(std::integral_constant<int, 0>{});
      } else if (kc == 1) {
        stage1(std::integral_constant<int, 1>{});
      } else {
        stage1(std::integral_constant<int, 2>{});
      }
    }
    kc = kc == 2 ? 0 : kc + 1;
    __syncthreads();
    if (on2 && k < last1) {  // stage 2: partial row p
      const int p = kBBatch * k + hb;
      A mom[4][4];  // [moment][pixel]
#pragma unroll
      for (int m = 0; m < 4; ++m) filter4(vbuf + (hb * 4 + m) * kBPitch + 4 * hg, mom[m]);
      const int mr = r0 - kHalf + p - offset;  // map row
      const bool row_ok = static_cast<unsigned>(mr) < static_cast<unsigned>(out_h);
      A part[4][4];  // [partial][pixel]
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        A g = A(0);
        const int mc = pmc0 + i;
        if (row_ok && static_cast<unsigned>(mc) < static_cast<unsigned>(out_w)) {
          g = kScalarGrad ? g_scalar
                          : to_acc(grad_plane[static_cast<int64_t>(mr) * out_w + mc]);
        }
        const A m4[4] = {mom[0][i], mom[1][i], mom[2][i], mom[3][i]};
        const SsimTerms<A> s = ssim_terms(m4);
        const A inv = fast_rcp<A>(s.b1 * s.b2);
        const A ssim = s.a1 * s.a2 * inv;
        const A da = s.a2 - s.a1;
        const A db = ssim * (s.b2 - s.b1);
        const A ginv = g * inv;
        part[0][i] = ginv * (A(2) * (m4[1] * da - m4[0] * db));  // g dS/dmu1
        part[1][i] = ginv * (A(2) * (m4[0] * da - m4[1] * db));  // g dS/dmu2
        part[2][i] = -ginv * ssim * s.b1;                        // g dS/dE[x² + y²]
        part[3][i] = ginv * (A(2) * s.a1);                       // g dS/dE[xy]
      }
      A* dst = pring + (p & (kBPRows - 1)) * 4 * kBPitch + 4 * hg;
#pragma unroll
      for (int q = 0; q < 4; ++q) store4(dst + q * kBPitch, part[q]);
    }
    if (on4 && k >= 4) {  // stage 4: gradient row q of batch k - 4
      const int row = r0 + kBBatch * (k - 4) + gb;
      if (row < height) {
        const int64_t idx = static_cast<int64_t>(row) * width + gcol;
        T xr[4];
        T yr[4];
        if (g_vec) {
          const Vec4<T> vx = *reinterpret_cast<const Vec4<T>*>(x + idx);
          const Vec4<T> vy = *reinterpret_cast<const Vec4<T>*>(y + idx);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            xr[i] = vx.v[i];
            yr[i] = vy.v[i];
          }
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const bool in = gcol + i < width;
            xr[i] = in ? x[idx + i] : zero<T>();
            yr[i] = in ? y[idx + i] : zero<T>();
          }
        }
        A f[4][4];  // [partial][pixel]
#pragma unroll
        for (int q = 0; q < 4; ++q) filter4(v2 + (gb * 4 + q) * kBPitch + 4 * gg, f[q]);
        A d1[4];
        A d2[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const A xv = to_acc(xr[i]);
          const A yv = to_acc(yr[i]);
          d1[i] = f[0][i] + A(2) * xv * f[2][i] + yv * f[3][i];
          d2[i] = f[1][i] + A(2) * yv * f[2][i] + xv * f[3][i];
        }
        T* out1 = grad1 + plane * plane_px + idx;
        T* out2 = need2 ? grad2 + plane * plane_px + idx : nullptr;
        if (g_vec) {
          store4(out1, d1);
          if (need2) store4(out2, d2);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (gcol + i < width) {
              out1[i] = from_acc<T>(d1[i]);
              if (need2) out2[i] = from_acc<T>(d2[i]);
            }
          }
        }
      }
    }
#ifndef GPUCHECK_DEFECT_NO_SYNC
    // Stage 3 reads partials of neighbouring rows and columns, which other threads wrote in
    // stage 2. Building with -DGPUCHECK_DEFECT_NO_SYNC drops this barrier: a deliberate
    // read-after-write race on shared memory for the sanitizer self-test (issue 9;
    // compute-sanitizer racecheck reports it). Never define it in a release build.
    __syncthreads();
#endif
    const int jb = k - 3;  // stage 3: gradient batch jb from partial rows 4 jb .. 4 jb + 13
    if (on3 && jb >= 0 && jb < batches) {
      switch (jb & (kBPRows / kBBatch - 1)) {
        case 0: stage3(std::integral_constant<int, 0>{}); break;
        case 1: stage3(std::integral_constant<int, 1>{}); break;
        case 2: stage3(std::integral_constant<int, 2>{}); break;
        default: stage3(std::integral_constant<int, 3>{}); break;
      }
    }
  }
}

// Resident backward blocks per multiprocessor (float32/16-bit: the launch bound above).
constexpr int kBResident = 4;
constexpr int kBMaxRows = 128;

// Gradient rows per backward block (a multiple of kBBatch). Model: a block's time is
// proportional to the rows it streams (rows + 16: the 20-row halo less the last partial
// batch, which only finishes the pipeline) and blocks run in waves of kBResident per
// multiprocessor, so a call costs ceil(blocks / slots) * (rows + 16); the cheapest wins
// (ties: the longer strip). E.g. on 132 multiprocessors: 120 rows at 5x3x1080x1920 (4.9
// waves) and at 1x3x1080x1920 (513 blocks, one wave). Defining GPUCHECK_SSIM_BROWS fixes it.
int backward_strip(const Geometry& g) {
#ifdef GPUCHECK_SSIM_BROWS
  static_assert(GPUCHECK_SSIM_BROWS % kBBatch == 0, "whole batches");
  return GPUCHECK_SSIM_BROWS;
#else
  const int64_t slots = static_cast<int64_t>(multiprocessors()) * kBResident;
  const int64_t columns = g.planes * ceil_div(g.width, kBCols);
  int best_rows = kBMaxRows;
  int64_t best_cost = -1;
  for (int rows = kBMaxRows; rows >= kBBatch; rows -= kBBatch) {
    const int64_t blocks = columns * ceil_div(g.height, rows);
    const int64_t cost = (blocks + slots - 1) / slots * (rows + 16);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_rows = rows;
    }
  }
  return best_rows;
#endif
}

struct BackwardGrid {
  int tiles_x;
  int tiles_y;
  int rows;  // gradient rows per block
};

inline BackwardGrid backward_grid(const Geometry& g) {
  const int rows = backward_strip(g);
  return {ceil_div(g.width, kBCols), ceil_div(g.height, rows), rows};
}

template <typename T>
__global__ void __launch_bounds__(kMeanThreads)
    ssim_mean_kernel(const acc_t<T>* __restrict__ partials,  // [count]
                     int64_t count, double scale,
                     T* __restrict__ out) {  // [1]
  __shared__ double sums[kMeanThreads];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += kMeanThreads) s += static_cast<double>(partials[i]);
  sums[threadIdx.x] = s;
  __syncthreads();
#pragma unroll
  for (int stride = kMeanThreads / 2; stride > 0; stride >>= 1) {
    if (static_cast<int>(threadIdx.x) < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = from_acc<T>(static_cast<acc_t<T>>(sums[0] * scale));
}

// In-place scale of a gradient computed ahead (reduction = mean): grad *= upstream[0] * factor,
// in the accumulator type (float32 for 16-bit: `factor` is a power of two and the product of
// two 16-bit values is exact in float32, so the result is rounded once). When that product is
// exactly 1 (the usual case: the gradient was computed ahead for the upstream gradient of
// 1 - ssim, -1) the scale is the identity and every thread returns without touching memory.
// Grid-stride: thread i scales packs i, i + stride, ... of kVec elements (16 bytes); the
// units after the last pack are the tail elements, one each.
template <typename T, int kVec>
struct alignas(kVec * sizeof(T)) Pack {
  T v[kVec];
};

constexpr int kScaleThreads = 256;

template <typename T, int kVec>
__global__ void __launch_bounds__(kScaleThreads)
    ssim_scale_kernel(T* __restrict__ grad,  // [n]
                      int64_t n,
                      const T* __restrict__ upstream,  // [1]
                      acc_t<T> factor) {
  using A = acc_t<T>;
  const A s = to_acc(upstream[0]) * factor;
  if (s == A(1)) return;
  const int64_t packs = n / kVec;
  const int64_t units = packs + n % kVec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kScaleThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kScaleThreads + threadIdx.x; i < units;
       i += stride) {
    if (i < packs) {
      Pack<T, kVec> p = reinterpret_cast<const Pack<T, kVec>*>(grad)[i];
#pragma unroll
      for (int e = 0; e < kVec; ++e) p.v[e] = from_acc<T>(to_acc(p.v[e]) * s);
      reinterpret_cast<Pack<T, kVec>*>(grad)[i] = p;
    } else {
      const int64_t e = packs * kVec + (i - packs);
      grad[e] = from_acc<T>(to_acc(grad[e]) * s);
    }
  }
}

// Blocks with more than 48 KiB of dynamic shared memory need the attribute raised first.
template <typename Kernel>
cudaError_t prepare(Kernel kernel, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem));
}

template <typename T>
cudaError_t forward_typed(const void* img1, const void* img2, const Geometry& geo, void* map,
                          void* partials, cudaStream_t stream) {
  using A = acc_t<T>;
  const TileGrid grid = forward_grid<T>(geo);
  const auto blocks = static_cast<unsigned>(geo.planes * grid.tiles_x * grid.tiles_y);
  const T* x = static_cast<const T*>(img1);
  const T* y = static_cast<const T*>(img2);
  // Static shared memory only (<= 32 KiB): no attribute needed.
  if (partials != nullptr) {
    ssim_forward_kernel<T, true><<<blocks, kFT<T>, 0, stream>>>(
        x, y, geo.height, geo.width, geo.out_height(), geo.out_width(), geo.offset(),
        grid.tiles_x, grid.tiles_y, nullptr, static_cast<A*>(partials));
  } else {
    ssim_forward_kernel<T, false><<<blocks, kFT<T>, 0, stream>>>(
        x, y, geo.height, geo.width, geo.out_height(), geo.out_width(), geo.offset(),
        grid.tiles_x, grid.tiles_y, static_cast<T*>(map), nullptr);
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t backward_typed(const void* grad, bool grad_is_scalar, double scale, const void* img1,
                           const void* img2, const Geometry& geo, void* grad1, void* grad2,
                           cudaStream_t stream) {
  using A = acc_t<T>;
  const BackwardGrid grid = backward_grid(geo);
  const int64_t blocks = geo.planes * grid.tiles_x * grid.tiles_y;
  const size_t smem = kBSmemElems * sizeof(A);
  const auto kernel = grad_is_scalar ? ssim_backward_kernel<T, true> : ssim_backward_kernel<T, false>;
  if (const cudaError_t err = prepare(kernel, smem); err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(blocks), kBT, smem, stream>>>(
      static_cast<const T*>(grad), static_cast<A>(scale), static_cast<const T*>(img1),
      static_cast<const T*>(img2), geo.height, geo.width, geo.out_height(), geo.out_width(),
      geo.offset(), grid.tiles_x, grid.tiles_y, grid.rows, static_cast<T*>(grad1),
      static_cast<T*>(grad2));
  return cudaSuccess;
}

template <typename T>
cudaError_t mean_typed(const void* partials, int64_t count, double scale, void* out,
                       cudaStream_t stream) {
  ssim_mean_kernel<T><<<1, kMeanThreads, 0, stream>>>(static_cast<const acc_t<T>*>(partials),
                                                       count, scale, static_cast<T*>(out));
  return cudaSuccess;
}

template <typename T>
cudaError_t scale_typed(void* grad, int64_t n, const void* upstream, double factor,
                        cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  T* g = static_cast<T*>(grad);
  const bool aligned = reinterpret_cast<uintptr_t>(grad) % 16 == 0;
  const int64_t units = aligned ? n / kVec + n % kVec : n;
  // One resident wave at most (8 blocks of 256 threads per SM): enough to stream at full
  // rate, and few blocks to retire when the scale is the identity.
  const int64_t blocks = std::min<int64_t>((units + kScaleThreads - 1) / kScaleThreads,
                                           int64_t{8} * multiprocessors());
  const auto grid = static_cast<unsigned>(blocks);
  const auto up = static_cast<const T*>(upstream);
  const auto f = static_cast<acc_t<T>>(factor);
  if (aligned) {
    ssim_scale_kernel<T, kVec><<<grid, kScaleThreads, 0, stream>>>(g, n, up, f);
  } else {
    ssim_scale_kernel<T, 1><<<grid, kScaleThreads, 0, stream>>>(g, n, up, f);
  }
  return cudaSuccess;
}

}  // namespace

int64_t forward_blocks(Dtype dtype, const Geometry& geo) {
  const TileGrid g =
      dtype == Dtype::kFloat64 ? forward_grid<double>(geo) : forward_grid<float>(geo);
  static_assert(kFCols<__half> == kFCols<float> && kFCols<__nv_bfloat16> == kFCols<float>);
  return geo.planes * g.tiles_x * g.tiles_y;
}

int64_t backward_blocks(const Geometry& geo) {
  const BackwardGrid g = backward_grid(geo);
  return geo.planes * g.tiles_x * g.tiles_y;
}

cudaError_t launch_forward(Dtype dtype, const void* img1, const void* img2, const Geometry& geo,
                           void* map, void* partials, cudaStream_t stream) {
  switch (dtype) {
    case Dtype::kFloat32: return forward_typed<float>(img1, img2, geo, map, partials, stream);
    case Dtype::kFloat16: return forward_typed<__half>(img1, img2, geo, map, partials, stream);
    case Dtype::kBFloat16:
      return forward_typed<__nv_bfloat16>(img1, img2, geo, map, partials, stream);
    case Dtype::kFloat64: return forward_typed<double>(img1, img2, geo, map, partials, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_mean(Dtype dtype, const void* partials, int64_t count, double scale,
                        void* out, cudaStream_t stream) {
  switch (dtype) {
    case Dtype::kFloat32: return mean_typed<float>(partials, count, scale, out, stream);
    case Dtype::kFloat16: return mean_typed<__half>(partials, count, scale, out, stream);
    case Dtype::kBFloat16: return mean_typed<__nv_bfloat16>(partials, count, scale, out, stream);
    case Dtype::kFloat64: return mean_typed<double>(partials, count, scale, out, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_backward(Dtype dtype, const void* grad, bool grad_is_scalar, double scale,
                            const void* img1, const void* img2, const Geometry& geo, void* grad1,
                            void* grad2, cudaStream_t stream) {
  switch (dtype) {
    case Dtype::kFloat32:
      return backward_typed<float>(grad, grad_is_scalar, scale, img1, img2, geo, grad1, grad2,
                                   stream);
    case Dtype::kFloat16:
      return backward_typed<__half>(grad, grad_is_scalar, scale, img1, img2, geo, grad1, grad2,
                                    stream);
    case Dtype::kBFloat16:
      return backward_typed<__nv_bfloat16>(grad, grad_is_scalar, scale, img1, img2, geo, grad1,
                                           grad2, stream);
    case Dtype::kFloat64:
      return backward_typed<double>(grad, grad_is_scalar, scale, img1, img2, geo, grad1, grad2,
                                    stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_scale(Dtype dtype, void* grad, int64_t n, const void* upstream, double factor,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (dtype) {
    case Dtype::kFloat32: return scale_typed<float>(grad, n, upstream, factor, stream);
    case Dtype::kFloat16: return scale_typed<__half>(grad, n, upstream, factor, stream);
    case Dtype::kBFloat16: return scale_typed<__nv_bfloat16>(grad, n, upstream, factor, stream);
    case Dtype::kFloat64: return scale_typed<double>(grad, n, upstream, factor, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gpucheck::ssim
