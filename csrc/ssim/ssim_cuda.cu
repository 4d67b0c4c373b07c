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
//
// This file: the forward kernel, the mean's second stage and the gradient scale, with their
// launchers; the backward kernel is in ssim_backward.cu, the device functions both use in
// ssim_device.cuh.

#include "ssim/ssim.h"
#include "ssim/ssim_device.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace gpucheck::ssim {
namespace {

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
// addresses), launch bound 4 -> 3 blocks/SM 0.5-2 % faster (same registers). The
// backward's knobs are in ssim_backward.cu.
#ifndef GPUCHECK_SSIM_FSTRIP
#define GPUCHECK_SSIM_FSTRIP 64
#endif
#ifndef GPUCHECK_SSIM_FBLOCKS
#define GPUCHECK_SSIM_FBLOCKS 3
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
