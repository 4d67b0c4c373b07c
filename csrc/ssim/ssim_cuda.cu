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
// Backward (first version's layout): a block of kThreads threads owns kThreads consecutive
// columns of one image plane and a strip of rows. It streams the strip's rows (plus the halo)
// through shared memory, kChunk = 11 rows at a time; the next chunk is prefetched into
// registers while the current one is filtered. Each thread filters its own column:
//   * horizontally, 11 taps read from shared memory, for the four moments;
//   * vertically, in registers: the last 11 horizontal results live in a ring of 11 slots.
//     The ring index of a row is (row mod 11); the row loop is unrolled by 11 so that every
//     ring index is a compile-time constant and the ring stays in registers.
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
#include "ssim/ssim.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

namespace gpucheck::ssim {
namespace {

constexpr int kThreads = 128;                  // columns per block (one per thread)
constexpr int kHalf = 5;                       // window radius
constexpr int kWin = 2 * kHalf + 1;            // 11
constexpr int kChunk = kWin;                   // rows per shared-memory chunk (= ring size)
constexpr int kSmemW = kThreads + 2 * kHalf;   // 138 columns of input per chunk row
constexpr int kChunkElems = kChunk * kSmemW;   // 1518
constexpr int kLoads = (kChunkElems + kThreads - 1) / kThreads;  // 12 per thread per image
// Backward: a strip of R gradient rows needs R + 20 input rows, streamed in chunks of 11:
// R = 11 * chunks - 20, with chunks chosen per call by backward_strip() (fewer, longer strips
// halve the halo recomputation; more, shorter ones fill the last wave of blocks). Defining
// GPUCHECK_SSIM_BCHUNKS fixes the number of chunks instead. The block's threads hold the
// partials of kThreads columns, so kThreads - 10 gradient columns come out per block.
constexpr int kBwdMinChunks = 3;
constexpr int kBwdMaxChunks = 12;
constexpr int kBwdCols = kThreads - 2 * kHalf;             // 118
constexpr int kMeanThreads = 256;

static_assert(kThreads % 32 == 0, "whole warps");

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

// One chunk (kChunk rows x kSmemW columns) of both images, held in registers between the
// global loads and the shared-memory stores so that the loads of chunk k+1 overlap the
// filtering of chunk k. The registers hold the raw elements: converting to the accumulator
// type at the load would make the thread wait for the load there (float16/bfloat16 ran 1.5x
// slower than float32 for that reason); the conversion happens in store().
template <typename T>
struct ChunkLoader {
  using A = acc_t<T>;
  T rx[kLoads];
  T ry[kLoads];

  // Rows row0.., columns col0.. of the plane; zero outside the image.
  __device__ __forceinline__ void fetch(const T* __restrict__ x, const T* __restrict__ y,
                                        int height, int width, int row0, int col0) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int e = static_cast<int>(threadIdx.x) + i * kThreads;
      const int rr = e / kSmemW;
      const int r = row0 + rr;
      const int c = col0 + (e - rr * kSmemW);
      T vx = zero<T>();
      T vy = zero<T>();
      if (e < kChunkElems && r >= 0 && r < height && c >= 0 && c < width) {
        const int64_t idx = static_cast<int64_t>(r) * width + c;
        vx = x[idx];
        vy = y[idx];
      }
      rx[i] = vx;
      ry[i] = vy;
    }
  }

  __device__ __forceinline__ void store(A* xs, A* ys) const {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int e = static_cast<int>(threadIdx.x) + i * kThreads;
      if (e < kChunkElems) {
        xs[e] = to_acc(rx[i]);
        ys[e] = to_acc(ry[i]);
      }
    }
  }
};

// Horizontal 11-tap filter of the four moments x, y, x² + y², xy (only the sum of the two
// variances enters SSIM); xr/yr point at the leftmost tap.
template <typename A>
__device__ __forceinline__ void filter_row(const A* xr, const A* yr, A (&h)[4]) {
  A a0 = A(0), a1 = A(0), a2 = A(0), a3 = A(0);
#pragma unroll
  for (int k = 0; k < kWin; ++k) {
    const A xv = xr[k];
    const A yv = yr[k];
    const A wx = gauss<A>(k) * xv;
    const A wy = gauss<A>(k) * yv;
    a0 += wx;
    a1 += wy;
    a2 = fma(wy, yv, fma(wx, xv, a2));
    a3 = fma(wx, yv, a3);
  }
  h[0] = a0;
  h[1] = a1;
  h[2] = a2;
  h[3] = a3;
}

// Vertical 11-tap filter over a ring whose oldest row sits in slot `first` (compile-time).
template <int N, typename A>
__device__ __forceinline__ void filter_ring(const A (&ring)[kWin][N], int first, A (&out)[N]) {
#pragma unroll
  for (int q = 0; q < N; ++q) out[q] = A(0);
#pragma unroll
  for (int k = 0; k < kWin; ++k) {
    const int slot = (first + k) % kWin;
#pragma unroll
    for (int q = 0; q < N; ++q) out[q] = fma(gauss<A>(k), ring[slot][q], out[q]);
  }
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

// Deterministic block sum (fixed shuffle tree, then warps in order); valid in thread 0.
template <typename A>
__device__ __forceinline__ A block_sum(A v) {
  __shared__ A warp_sums[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  A total = A(0);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  }
  return total;
}

struct TileGrid {
  int tiles_x;
  int tiles_y;
};

__host__ __device__ inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Resident backward blocks per multiprocessor (float32/16-bit: the launch bound below).
constexpr int kBwdResident = 3;

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

// Gradient rows per backward block. Model: a block's time is proportional to the rows it
// streams (11 * chunks) and blocks run in waves of kBwdResident per multiprocessor, so the
// call costs ceil(blocks / slots) * 11 * chunks; the cheapest number of chunks wins (ties:
// the longer strip). E.g. on 132 multiprocessors: 10 chunks (90 rows, 7.7 waves) at
// 5x3x1080x1920, 9 chunks (79 rows, 1.8 waves instead of 1.5 -> 2) at 1x3x1080x1920.
int backward_strip(const Geometry& g) {
#ifdef GPUCHECK_SSIM_BCHUNKS
  return GPUCHECK_SSIM_BCHUNKS * kChunk - 4 * kHalf;
#else
  const int64_t slots = static_cast<int64_t>(multiprocessors()) * kBwdResident;
  const int64_t columns = g.planes * ceil_div(g.width, kBwdCols);
  int best_rows = kBwdMaxChunks * kChunk - 4 * kHalf;
  int64_t best_cost = -1;
  for (int chunks = kBwdMaxChunks; chunks >= kBwdMinChunks; --chunks) {
    const int rows = chunks * kChunk - 4 * kHalf;
    const int64_t blocks = columns * ceil_div(g.height, rows);
    const int64_t cost = (blocks + slots - 1) / slots * chunks;
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
  return {ceil_div(g.width, kBwdCols), ceil_div(g.height, rows), rows};
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
// No bounds checks inside the
// filters: out-of-image rows/columns are loaded as zero (zero padding).
constexpr int kFT = 128;                       // threads per block
constexpr int kFCols = 116;                    // map columns per block (29 groups of 4)
constexpr int kFGroups = kFCols / 4;           // 29
constexpr int kFBatch = 4;                     // map rows per horizontal pass
constexpr int kFRing = 12;                     // ring slots: >= 11, multiple of kFBatch
// Tuning knobs (defaults measured best on H200, 2026-11-21, fp32 5x3x1080x1920: forward
// strip 32 -> 64 rows 5 % faster, 96 no better (and 16 % slower at 1x3x1080x1920); 4 -> 5
// forward blocks/SM (96 registers, spills) 10 % slower; third version: register prefetch
// 12 -> 6 rows ahead 2 % faster (116 instead of 124 registers, fewer rematerialized
// addresses), launch bound 4 -> 3 blocks/SM 0.5-2 % faster (same registers); backward 2 -> 3 blocks/SM
// (255 -> 168 registers) 16 % faster, 4 (128 registers, spills) 45 % slower; backward strip
// of 6 -> 10 chunks (46 -> 90 gradient rows per block, less halo recomputation) 11 % faster).
#ifndef GPUCHECK_SSIM_FSTRIP
#define GPUCHECK_SSIM_FSTRIP 64
#endif
#ifndef GPUCHECK_SSIM_FBLOCKS
#define GPUCHECK_SSIM_FBLOCKS 3
#endif
#ifndef GPUCHECK_SSIM_BBLOCKS
#define GPUCHECK_SSIM_BBLOCKS 3
#endif
#ifndef GPUCHECK_SSIM_FPRE
#define GPUCHECK_SSIM_FPRE 6
#endif
constexpr int kFStrip = GPUCHECK_SSIM_FSTRIP;
// Rows of register prefetch ahead of the row being filtered (divides kFRing).
constexpr int kFPre = GPUCHECK_SSIM_FPRE;  // map rows per block
constexpr int kFStream = kFStrip + 2 * kHalf;  // input rows streamed per block (42)
constexpr int kFPitch = kFT;                   // shared row pitch (columns)
static_assert(kFCols + 2 * kHalf <= kFT, "one input column per thread");
static_assert(kFGroups * kFBatch <= kFT, "one horizontal group per thread");
static_assert(4 * (kFGroups - 1) + 16 <= kFPitch, "16-value reads stay in the row");
static_assert(kFRing % kFBatch == 0 && kFRing >= kWin && kFStrip % kFBatch == 0, "ring");
static_assert(kFRing % kFPre == 0, "prefetch slot of a ring slot is a compile-time constant");
static_assert(kFT == kThreads, "block_sum assumes kThreads threads");

inline TileGrid forward_grid(const Geometry& g) {
  return {ceil_div(g.out_width(), kFCols), ceil_div(g.out_height(), kFStrip)};
}

// float/half/bf16: <= 128 registers (4 blocks = 16 warps per SM); float64 needs twice the
// registers for the same ring.
template <typename T>
constexpr int kFMinBlocks = std::is_same_v<T, double> ? 2 : GPUCHECK_SSIM_FBLOCKS;

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
                                             acc_t<T> (&vrows)[2][kFBatch][4][kFPitch],
                                             acc_t<T>& sum) {
  using A = acc_t<T>;
  // Prefetched rows as raw elements, converted when used (see ChunkLoader).
  T px[kFPre];
  T py[kFPre];
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
  for (int u = 0; u < kFPre; ++u) fetch(u, px[u], py[u]);

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
        const A xv = to_acc(px[u % kFPre]);
        const A yv = to_acc(py[u % kFPre]);
        fetch(t + kFPre, px[u % kFPre], py[u % kFPre]);
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
          for (int m = 0; m < 4; ++m) vbase[bsel][(kRowInBatch * 4 + m) * kFPitch] = v[m];
          if (kRowInBatch == kFBatch - 1) {  // batch complete
            __syncthreads();
            const int o_row = o_row0 + o - (kFBatch - 1) + hb;
            if (h_on && o_row < out_h) {
              A mom[4][4];  // [moment][pixel]
#pragma unroll
              for (int m = 0; m < 4; ++m) {
                const A* src = hbase[bsel] + m * kFPitch;
                A w[16];
#pragma unroll
                for (int q = 0; q < 4; ++q) load4(src + 4 * q, w + 4 * q);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                  A acc = gauss<A>(0) * w[i];
#pragma unroll
                  for (int k = 1; k < kWin; ++k) acc = fma(gauss<A>(k), w[i + k], acc);
                  mom[m][i] = acc;
                }
              }
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
__global__ void __launch_bounds__(kFT, kFMinBlocks<T>)
    ssim_forward_kernel(const T* __restrict__ img1,  // [planes, H, W]
                        const T* __restrict__ img2,  // [planes, H, W]
                        int height, int width, int out_h, int out_w, int offset, int tiles_x,
                        int tiles_y,
                        T* __restrict__ map,               // [planes, out_h, out_w] or null
                        acc_t<T>* __restrict__ partials) {  // [blocks] or null
  using A = acc_t<T>;
  // [buffer][map row in batch][moment][column]
  __shared__ __align__(16) A vrows[2][kFBatch][4][kFPitch];
#ifdef GPUCHECK_DEFECT_SHARED_OOB
  // Deliberate defect for the sanitizer self-test (issue 9): thread 0 of every block writes
  // an element 64 elements past the end of vrows, i.e. past the end of the block's shared
  // memory whatever the order of its static arrays (block_sum's warp_sums is 4 elements), so
  // compute-sanitizer memcheck reports an invalid __shared__ write. Never define it in a
  // release build.
  if (threadIdx.x == 0) {
    volatile A* past_end = &vrows[0][0][0][0] + 2 * kFBatch * 4 * kFPitch + 64;
    *past_end = A(0);
  }
#endif

  const int64_t block = blockIdx.x;
  const int tx = static_cast<int>(block % tiles_x);
  const int64_t rest = block / tiles_x;
  const int ty = static_cast<int>(rest % tiles_y);
  const int64_t plane = rest / tiles_y;
  const int o_col0 = tx * kFCols;
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
  const int hb = tid / kFGroups;
  const int hg = tid - hb * kFGroups;
  const bool h_on = tid < kFGroups * kFBatch;
  const int h_col = o_col0 + 4 * hg;
  const bool h_vec = !kMean && (out_w % 4 == 0) && h_col + 3 < out_w;
  T* map_plane = kMean ? nullptr : map + plane * (static_cast<int64_t>(out_h) * out_w);
  A sum = A(0);
  // Rows ri0 .. ri0 + kFStream - 1 are streamed; the register prefetch runs kFPre rows ahead
  // of the row being filtered. Blocks whose streamed and prefetched rows all lie inside the
  // image (all but the top and bottom strips) take the unchecked path: no row bounds checks,
  // the row address advanced by one add. Out-of-image columns (col_in false: a per-thread,
  // loop-invariant predicate) read as zero on both paths.
  const bool rows_inside = ri0 >= 0 && ri0 + kFStream + kFPre <= height &&
                           plane_px <= static_cast<int64_t>(0x7fffffff);
  if (rows_inside) {
    forward_rows<T, kMean, true>(xcol, ycol, col_in, ri0, height, width, out_h, out_w, o_row0,
                                 tid, hb, hg, h_on, h_col, h_vec, map_plane, vrows, sum);
  } else {
    forward_rows<T, kMean, false>(xcol, ycol, col_in, ri0, height, width, out_h, out_w, o_row0,
                                  tid, hb, hg, h_on, h_col, h_vec, map_plane, vrows, sum);
  }
  if constexpr (kMean) {
    const A total = block_sum(sum);
    if (threadIdx.x == 0) partials[block] = total;
  }
}

// Backward. Block = (plane, strip of `strip_rows` image rows, kBwdCols image columns). Thread j
// computes the weighted partials of image column c0 - 5 + j (stage A) and, for 5 <= j < 123,
// the gradient of image column c0 - 5 + j (stage B).
// float/half/bf16: <= 168 registers (3 blocks = 12 warps per SM).
template <typename T>
constexpr int kBMinBlocks = std::is_same_v<T, double> ? 1 : GPUCHECK_SSIM_BBLOCKS;

template <typename T, bool kScalarGrad>
__global__ void __launch_bounds__(kThreads, kBMinBlocks<T>)
    ssim_backward_kernel(const T* __restrict__ grad,  // [1] or [planes, out_h, out_w]
                         acc_t<T> scale,
                         const T* __restrict__ img1,  // [planes, H, W]
                         const T* __restrict__ img2,  // [planes, H, W]
                         int height, int width, int out_h, int out_w, int offset, int tiles_x,
                         int tiles_y, int strip_rows,
                         T* __restrict__ grad1,   // [planes, H, W]
                         T* __restrict__ grad2) {  // [planes, H, W] or null
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* xs = reinterpret_cast<A*>(smem_raw);  // [kChunk, kSmemW]
  A* ys = xs + kChunkElems;                // [kChunk, kSmemW]
  A* ps = ys + kChunkElems;                // [kChunk, 4, kThreads] weighted partials

  const int64_t block = blockIdx.x;
  const int tx = static_cast<int>(block % tiles_x);
  const int64_t rest = block / tiles_x;
  const int ty = static_cast<int>(rest % tiles_y);
  const int64_t plane = rest / tiles_y;

  const int c0 = tx * kBwdCols;
  const int r0 = ty * strip_rows;
  const int rows_out = min(strip_rows, height - r0);
  const int in_rows = rows_out + 4 * kHalf;
  const int chunks = ceil_div(in_rows, kChunk);
  const int img_row0 = r0 - 2 * kHalf;  // image row of streamed row 0
  const int img_col0 = c0 - 2 * kHalf;  // image column of shared column 0

  const int64_t plane_px = static_cast<int64_t>(height) * width;
  const T* x = img1 + plane * plane_px;
  const T* y = img2 + plane * plane_px;
  const int j = threadIdx.x;
  // Stage A: this thread's partials column, and whether it is a map column.
  const int p_col = c0 - kHalf + j;
  const int p_mcol = p_col - offset;  // map column
  const bool p_col_ok = p_mcol >= 0 && p_mcol < out_w;
  // Stage B: this thread's gradient column; reads centre on jc (in range for every thread).
  const int g_col = c0 - kHalf + j;
  const bool g_ok = j >= kHalf && j < kThreads - kHalf && g_col < width;
  const int jc = min(max(j, kHalf), kThreads - kHalf - 1);
  const bool need2 = grad2 != nullptr;

  const T* grad_plane =
      kScalarGrad ? grad : grad + plane * (static_cast<int64_t>(out_h) * out_w);
  const A g_scalar = kScalarGrad ? to_acc(grad[0]) * scale : A(0);

  A ring_a[kWin][4];  // horizontal moments of streamed rows
  A ring_b[kWin][4];  // horizontal filtered partials of partial rows
  ChunkLoader<T> loader;
  loader.fetch(x, y, height, width, img_row0, img_col0);
  for (int c = 0; c < chunks; ++c) {
    loader.store(xs, ys);
    __syncthreads();
    if (c + 1 < chunks) loader.fetch(x, y, height, width, img_row0 + (c + 1) * kChunk, img_col0);
    // Stage A: moments of streamed row t; at t >= 10 the partials of partial row m = t - 10
    // (image row r0 - 5 + m) go to ps[u].
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const int t = c * kChunk + u;
      if (t < in_rows) {
        filter_row<A>(xs + u * kSmemW + j, ys + u * kSmemW + j, ring_a[u]);
        if (t >= 2 * kHalf) {
          A m[4];
          filter_ring<4>(ring_a, (u + 1) % kWin, m);
          const int p_mrow = r0 - kHalf + (t - 2 * kHalf) - offset;  // map row
          A g = A(0);
          if (p_col_ok && p_mrow >= 0 && p_mrow < out_h) {
            g = kScalarGrad ? g_scalar
                            : to_acc(grad_plane[static_cast<int64_t>(p_mrow) * out_w + p_mcol]);
          }
          const SsimTerms<A> s = ssim_terms(m);
          const A inv = fast_rcp<A>(s.b1 * s.b2);
          const A ssim = s.a1 * s.a2 * inv;
          const A da = s.a2 - s.a1;
          const A db = ssim * (s.b2 - s.b1);
          const A ginv = g * inv;
          A* p = ps + u * 4 * kThreads + j;
          p[0 * kThreads] = ginv * (A(2) * (m[1] * da - m[0] * db));  // g dS/dmu1
          p[1 * kThreads] = ginv * (A(2) * (m[0] * da - m[1] * db));  // g dS/dmu2
          p[2 * kThreads] = -ginv * ssim * s.b1;                      // g dS/dE[x² + y²]
          p[3 * kThreads] = ginv * (A(2) * s.a1);                     // g dS/dE[xy]
        }
      }
    }
#ifndef GPUCHECK_DEFECT_NO_SYNC
    // Stage B reads the partials of neighbouring columns, which other threads wrote. Building
    // with -DGPUCHECK_DEFECT_NO_SYNC drops this barrier: a deliberate read-after-write race on
    // shared memory for the sanitizer self-test (issue 9; compute-sanitizer racecheck reports
    // it). Never define it in a release build.
    __syncthreads();
#endif
    // Stage B: filter partial row m = t - 10 horizontally (ring slot m % 11 == (u + 1) % 11);
    // at m >= 10 gradient row q = m - 10 (image row r0 + q) is complete.
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      const int t = c * kChunk + u;
      if (t < in_rows && t >= 2 * kHalf) {
        const int slot = (u + 1) % kWin;
        const A* p = ps + u * 4 * kThreads + (jc - kHalf);
#pragma unroll
        for (int q = 0; q < 4; ++q) ring_b[slot][q] = A(0);
#pragma unroll
        for (int k = 0; k < kWin; ++k) {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            ring_b[slot][q] = fma(gauss<A>(k), p[q * kThreads + k], ring_b[slot][q]);
          }
        }
        if (t >= 4 * kHalf && g_ok) {
          A f[4];
          filter_ring<4>(ring_b, (u + 2) % kWin, f);
          const int row = r0 + t - 4 * kHalf;
          const int64_t idx = static_cast<int64_t>(row) * width + g_col;
          const A xv = to_acc(x[idx]);
          const A yv = to_acc(y[idx]);
          const A d1 = f[0] + A(2) * xv * f[2] + yv * f[3];
          grad1[plane * plane_px + idx] = from_acc<T>(d1);
          if (need2) {
            const A d2 = f[1] + A(2) * yv * f[2] + xv * f[3];
            grad2[plane * plane_px + idx] = from_acc<T>(d2);
          }
        }
      }
    }
  }
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
  const TileGrid grid = forward_grid(geo);
  const auto blocks = static_cast<unsigned>(forward_blocks(geo));
  const T* x = static_cast<const T*>(img1);
  const T* y = static_cast<const T*>(img2);
  // Static shared memory only (<= 32 KiB): no attribute needed.
  if (partials != nullptr) {
    ssim_forward_kernel<T, true><<<blocks, kFT, 0, stream>>>(
        x, y, geo.height, geo.width, geo.out_height(), geo.out_width(), geo.offset(),
        grid.tiles_x, grid.tiles_y, nullptr, static_cast<A*>(partials));
  } else {
    ssim_forward_kernel<T, false><<<blocks, kFT, 0, stream>>>(
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
  const size_t smem = (2 * kChunkElems + kChunk * 4 * kThreads) * sizeof(A);
  const auto kernel = grad_is_scalar ? ssim_backward_kernel<T, true> : ssim_backward_kernel<T, false>;
  if (const cudaError_t err = prepare(kernel, smem); err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
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

}  // namespace

int64_t forward_blocks(const Geometry& geo) {
  const TileGrid g = forward_grid(geo);
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

}  // namespace gpucheck::ssim
