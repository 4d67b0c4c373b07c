// Fused SSIM kernels: forward (map or the sums of the map's cells) and backward (recomputing;
// in the training step also the cells' sums), plus the deterministic second stage of the mean.
//
// Only four windowed moments enter SSIM: mu1 = G*x, mu2 = G*y, G*(x² + y²) (the two variances
// appear only as their sum) and G*(xy). Out-of-image pixels read as zero (zero padding), so
// tiles need not divide the image.
//
// Arithmetic: the SSIM constants ride on the vertical filter's first tap and the factor 2 of
// the xy moment on its weights, so that the SSIM terms take six operations (ssim_terms); the
// forward and the backward kernel form each map value with the same operations in the same
// order (ssim_device.cuh), bit for bit.
//
// Forward: vertical pass first, in registers, one input column per thread, rows streamed
// straight from global memory into a 16-row register ring; horizontal pass from shared memory,
// 4 map columns per thread with 16-byte shared loads. See ssim_forward_kernel.
//
// Backward: the forward's layout twice over, in batches of 4 rows: moments vertically in a
// register ring, horizontally from shared memory (16-byte loads), the four weighted partials
// into a shared ring of rows, then the partials vertically (4 rows per thread from that ring)
// and horizontally (16-byte loads), and the gradient. See ssim_backward_kernel. The training
// step (reduction = mean, ssim_train) runs only this kernel: it also adds up the map values it
// computes anyway for the partials, cell by cell, as the forward does.
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
// Determinism: no atomics. With reduction = mean the kernels write the sum of each cell of the
// map (16 x 116 window centres, summed in one fixed order: ssim_device.cuh) and one block adds
// the cells in a fixed order in float64: the same mean from either kernel.
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
// Block = (plane, strip of kFStrip map rows, kFCols = 116 map columns), kFT = 128 threads. The
// block's tile is placed in window-centre (image) coordinates: its map pixels are centred on
// image rows R0 .. R0 + kFStrip - 1 and columns C0 .. C0 + 115, with (R0, C0) = (kFStrip ty,
// 116 tx) + `base`; base = kCellShift with reduction = mean (the tile is then a column of cells
// of the mean, ssim_device.cuh), the padding's offset for the map (its columns then start at a
// multiple of 116, for aligned 16-byte stores). Map pixels whose centre lies outside the map
// are skipped.
//   * Vertical: thread t owns input column C0 - 5 + t (126 of 128 threads used), streams the
//     strip's rows plus the 5-row halo straight from global memory (coalesced across the warp;
//     fetched kFPre rows ahead) and keeps the four quantities of the last 16 rows in a register
//     ring; it writes the vertically filtered row to shared memory.
//   * Horizontal: every kFBatch = 4 map rows, thread (b, g) of 4 x 29 filters map row b of the
//     batch, columns 4g..4g+3, reading 16 values per moment with four 16-byte shared loads, and
//     stores 4 map values, or adds them up for its lane of the cell (ssim_device.cuh).
// The rows are streamed in a prologue (the first 10 rows: quantities only), then one cycle per
// cell, 16 map rows each: a runtime loop whose body is unrolled, so that every ring slot, shared
// buffer and batch of the cell is a compile-time constant. A fetched row goes straight into its
// ring slot (16-bit rows into a ring of kFPre raw rows, converted when the row becomes current):
// the slot of row t + 6 is that of row t - 10, free once row t has been filtered; no register
// moves. Two shared buffers of 4 filtered rows (batch j in buffer j % 2): one barrier per batch.
// Blocks inside the image take a path without row, column or map bounds checks (a pointer and
// a 32-bit offset per row); elsewhere out-of-image rows and columns read as zero (zero padding).
//
// Measured before this layout (H200, 2026-11-21..24, fp32 5x3x1080x1920): strip 32 -> 64 rows
// 5 % faster, 96 no better (and 16 % slower at 1x3x1080x1920); 5 blocks/SM (96 registers,
// spills) 10 % slower; 256-thread blocks (244 columns) 3 % faster at 5x3 but 16 % slower at
// 5x1x1500x1500 (wave quantization); float32 rows fetched 12 instead of 6 rows ahead 7-9 %
// slower (136 registers), 16-bit rows 6 -> 12 rows ahead 3 % faster (their long-scoreboard
// stalls were 3.5x float32's); converting 16-bit rows when loaded instead of when used 40 %
// slower (the wait moves right after the load). The backward's knobs are in ssim_backward.cu.
constexpr int kFT = 128;
constexpr int kFCols = kCellCols;              // map columns per block: one cell (116)
constexpr int kFGroups = kCellGroups;          // 29 groups of 4 columns
constexpr int kFBatch = kBatchRows;            // map rows per horizontal pass (4)
constexpr int kFRing = kCellRows;              // ring slots = map rows of a cycle (16)
constexpr int kFBufs = 2;                      // shared buffers of one batch each
#ifndef GPUCHECK_SSIM_FSTRIP
#define GPUCHECK_SSIM_FSTRIP 64
#endif
constexpr int kFStrip = GPUCHECK_SSIM_FSTRIP;
constexpr int kFCells = kFStrip / kCellRows;   // cycles of the row loop (4)
constexpr int kFStream = kFStrip + 2 * kHalf;  // input rows streamed per block (74)
// Rows fetched ahead of the row being filtered: at most kFRing - 10 where rows go straight into
// the ring (float32, float64); 16-bit rows wait in a ring of their own (its size divides 16).
template <typename T>
constexpr int kFPre = sizeof(T) == 2 ? 8 : kFRing - 2 * kHalf;
// Input rows a block fetches: the cycles fetch kFPre rows ahead unconditionally.
template <typename T>
constexpr int kFFetched = std::max(kFStream, 2 * kHalf + kFStrip + kFPre<T>);
constexpr int kFPitch = kFT;                   // shared row pitch (columns)
constexpr int kFBufElems = kFBatch * 4 * kFPitch;  // [row in batch][moment][column]
constexpr int kFWarpSums = kFCells * kCellWarps;
template <typename T>
constexpr size_t kFSmemBytes = (kFBufs * kFBufElems + kFWarpSums) * sizeof(acc_t<T>);
static_assert(kFCols + 2 * kHalf <= kFT, "one input column per thread");
static_assert(kFGroups * kFBatch <= kFT && kFT == 32 * kCellWarps, "the cell's lanes");
static_assert(4 * (kFGroups - 1) + 16 <= kFPitch, "16-value reads stay in the row");
static_assert(kFStrip % kCellRows == 0, "whole cells");
static_assert(kFRing % kFBatch == 0 && (kFRing / kFBatch) % kFBufs == 0,
              "batch j in buffer j % 2, a constant in each position of the cycle");
static_assert(kFRing % kFPre<__half> == 0 && kFPre<float> + 2 * kHalf <= kFRing,
              "ring and prefetch slots are compile-time constants");

// Resident blocks per multiprocessor the registers must allow: GPUCHECK_SSIM_FBLOCKS = 4
// (<= 128 registers, 16 warps per SM) for float32 and for 16-bit with reduction = mean (the
// kernels timed; without the bound ptxas takes 148 registers, i.e. 3 blocks); 3 for the 16-bit
// map (at 4 it spills); float64 needs twice the registers for the same ring.
#ifndef GPUCHECK_SSIM_FBLOCKS
#define GPUCHECK_SSIM_FBLOCKS 4
#endif
template <typename T, bool kMean>
constexpr int kFMinBlocks = std::is_same_v<T, double>     ? 2
                            : sizeof(T) == 2 && !kMean ? 3
                                                       : GPUCHECK_SSIM_FBLOCKS;

template <typename T>
TileGrid forward_grid(const Geometry& g, bool mean) {
  if (mean) {  // tiles of cells, over every window centre of the image
    const CellGrid c = cell_grid(g);
    return {c.segs, ceil_div(c.bands * kCellRows, kFStrip)};
  }
  return {ceil_div(g.out_width(), kFCols), ceil_div(g.out_height(), kFStrip)};
}

// Where a forward block lies: inside the image (every fetched row and column, every map pixel
// of its tile) or at an edge, and whether its plane has < 2^31 pixels (32-bit row offsets).
enum class Tile { kInterior, kEdge, kHugeEdge };

// The streamed rows of one forward block (see above). kInterior: a fetch is two loads and one
// 32-bit add, and nothing is masked. Edges: each fetch checks its row and column (predicated
// loads), and the map pixels their place in the map. Writes the map or, with kMean, the warp
// sums of the block's cells (`smem` after the buffers, [cell][warp]).
template <typename T, bool kMean, Tile kTile>
__device__ __forceinline__ void forward_rows(const T* xcol, const T* ycol, bool col_in, int ri0,
                                             int height, int width, int R0, int C0, int offset,
                                             int out_h, int out_w, T* __restrict__ map_plane,
                                             acc_t<T>* __restrict__ smem) {
  using A = acc_t<T>;
  constexpr bool kInterior = kTile == Tile::kInterior;
  constexpr bool kDirect = std::is_same_v<T, A>;  // rows fetched straight into the ring
  constexpr int kPre = kFPre<T>;
  const int tid = threadIdx.x;
  // Horizontal role: map row hb of each batch, map columns mc0 .. mc0 + 3.
  const int hb = tid / kFGroups;
  const int hg = tid - hb * kFGroups;
  const bool h_on = tid < kFGroups * kFBatch;
  const int mc0 = C0 + 4 * hg - offset;
  const int mr0 = R0 + hb - offset;  // map row in batch 0
  const bool cols_ok = kInterior || (mc0 >= 0 && mc0 + 3 < out_w);
  const bool h_vec = !kMean && cols_ok && out_w % 4 == 0;
  A* const vdst = smem + tid;                                // + ((buf 4 + row) 4 + m) pitch
  const A* const hsrc = smem + hb * 4 * kFPitch + 4 * hg;    // + buf elems + m pitch
  A* const wsum = smem + kFBufs * kFBufElems;                // [cell][warp]
  CellLane<A> lane;

  // Planes of < 2^31 pixels: the element offset of the next row to fetch from the column
  // pointers, one 32-bit add per row, each load's address one multiply-add (modulo 2^32 above
  // and below the image, where edge blocks load nothing).
  if constexpr (kTile != Tile::kHugeEdge) {
    xcol = opaque(xcol);
    ycol = opaque(ycol);
  }
  unsigned off = static_cast<unsigned>(ri0) * static_cast<unsigned>(width);
  auto fetch = [&](int t, T& vx, T& vy) {  // streamed row t
    if constexpr (kInterior) {
      vx = __ldg(xcol + off);
      vy = __ldg(ycol + off);
      off += static_cast<unsigned>(width);
    } else if constexpr (kTile == Tile::kEdge) {
      vx = zero<T>();
      vy = zero<T>();
      if (col_in && static_cast<unsigned>(ri0 + t) < static_cast<unsigned>(height)) {
        vx = __ldg(xcol + off);
        vy = __ldg(ycol + off);
      }
      off += static_cast<unsigned>(width);
    } else {
      vx = zero<T>();
      vy = zero<T>();
      const int r = ri0 + t;
      if (col_in && static_cast<unsigned>(r) < static_cast<unsigned>(height)) {
        const int64_t idx = static_cast<int64_t>(r) * width;
        vx = xcol[idx];
        vy = ycol[idx];
      }
    }
  };

  A ring[kFRing][4];               // quantities of streamed row t in slot t % 16
  T raw[kDirect ? 1 : kPre][2];    // 16-bit: fetched rows, in slot t % kPre until current
  // Fetch streamed row t (kPhase = t mod 16, a multiple of 16 away) into its slot.
  auto fetch_row = [&](auto phase, int t) {
    constexpr int kPhase = decltype(phase)::value;
    if constexpr (kDirect) {
      fetch(t, ring[kPhase % kFRing][0], ring[kPhase % kFRing][1]);
    } else {
      fetch(t, raw[kPhase % kPre][0], raw[kPhase % kPre][1]);
    }
  };
  // Streamed row t (kPhase as above) becomes current: its four quantities into slot t % 16.
  auto push = [&](auto phase) {
    constexpr int kPhase = decltype(phase)::value;
    constexpr int kSlot = kPhase % kFRing;
    A q[4];
    if constexpr (kDirect) {
      quantities(ring[kSlot][0], ring[kSlot][1], q);
    } else {
      quantities(to_acc(raw[kPhase % kPre][0]), to_acc(raw[kPhase % kPre][1]), q);
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) ring[kSlot][m] = q[m];
  };

  // The horizontal pass of batch jb (shared buffer kBuf, batch kQ of its cell): 4 map pixels
  // per thread.
  auto horizontal = [&](int jb, auto bufc, auto qc) {
    constexpr int kBuf = decltype(bufc)::value;
    const int mr = mr0 + kFBatch * jb;
    const bool row_ok = kInterior || static_cast<unsigned>(mr) < static_cast<unsigned>(out_h);
    [[maybe_unused]] A s = A(0);
    if (h_on && row_ok) {
      A mom[4][4];  // [moment][pixel]
#pragma unroll
      for (int m = 0; m < 4; ++m) filter4(hsrc + kBuf * kFBufElems + m * kFPitch, mom[m]);
      A val[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const A m4[4] = {mom[0][i], mom[1][i], mom[2][i], mom[3][i]};
        const SsimTerms<A> t = ssim_terms(m4);
        val[i] = ssim_value(t, ssim_inverse(t));
      }
      if constexpr (kMean) {
        if (!cols_ok) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (static_cast<unsigned>(mc0 + i) >= static_cast<unsigned>(out_w)) val[i] = A(0);
          }
        }
        s = add(add(val[0], val[1]), add(val[2], val[3]));
      } else {
        T* dst = map_plane + static_cast<int64_t>(mr) * out_w + mc0;
        if (h_vec) {
          store4(dst, val);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (static_cast<unsigned>(mc0 + i) < static_cast<unsigned>(out_w)) {
              dst[i] = from_acc<T>(val[i]);
            }
          }
        }
      }
    }
    if constexpr (kMean) {  // every thread: its lane's share of the batch's cell
      lane.template add<decltype(qc)::value>(s, wsum + jb / kCellBatches * kCellWarps, tid >> 5);
    }
  };

  // Map row o = 16 c + u (streamed row t = o + 10, ring slot (10 + u) % 16): quantities,
  // vertical filter of rows t - 10 .. t (slots u .. u + 10) into batch o / 4's buffer, then the
  // fetch of row t + kPre into the slot of row t - 10 (free now); after a batch's last row, the
  // horizontal pass.
  auto row = [&](auto uc, int c) {
    constexpr int kU = decltype(uc)::value;
    constexpr int kPhase = 2 * kHalf + kU;
    push(std::integral_constant<int, kPhase>{});
    A v[4];
    vertical_filter<kU>(ring, v);
    constexpr int kBatch = kU / kFBatch;  // batch of the cell
    constexpr int kBuf = kBatch % kFBufs;
    constexpr int kRow = kU % kFBatch;
#pragma unroll
    for (int m = 0; m < 4; ++m) vdst[((kBuf * kFBatch + kRow) * 4 + m) * kFPitch] = v[m];
    fetch_row(std::integral_constant<int, kPhase + kPre>{}, kPhase + kFRing * c + kPre);
    if constexpr (kRow == kFBatch - 1) {
      __syncthreads();
      horizontal(kCellBatches * c + kBatch, std::integral_constant<int, kBuf>{},
                 std::integral_constant<int, kBatch>{});
    }
  };

  [&]<int... kT>(std::integer_sequence<int, kT...>) {  // rows 0 .. kPre - 1 ahead
    (fetch_row(std::integral_constant<int, kT>{}, kT), ...);
  }(std::make_integer_sequence<int, kPre>{});
  [&]<int... kT>(std::integer_sequence<int, kT...>) {  // prologue: rows 0 .. 9
    ((push(std::integral_constant<int, kT>{}),
      fetch_row(std::integral_constant<int, kT + kPre>{}, kT + kPre)),
     ...);
  }(std::make_integer_sequence<int, 2 * kHalf>{});
#pragma unroll 1
  for (int c = 0; c < kFCells; ++c) {
    [&]<int... kU>(std::integer_sequence<int, kU...>) {
      (row(std::integral_constant<int, kU>{}, c), ...);
    }(std::make_integer_sequence<int, kFRing>{});
  }
}

template <typename T, bool kMean>
__global__ void __launch_bounds__(kFT, kFMinBlocks<T, kMean>)
    ssim_forward_kernel(const T* __restrict__ img1,  // [planes, H, W]
                        const T* __restrict__ img2,  // [planes, H, W]
                        int height, int width, int out_h, int out_w, int offset, int base,
                        int tiles_x, int tiles_y, int bands, int segs,
                        T* __restrict__ map,               // [planes, out_h, out_w] or null
                        acc_t<T>* __restrict__ partials) {  // [planes, bands, segs] or null
  using A = acc_t<T>;
  // [buffer][map row in batch][moment][column], then the cells' warp sums [batch][warp]
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* const smem = reinterpret_cast<A*>(smem_raw);
#ifdef GPUCHECK_DEFECT_SHARED_OOB
  // Deliberate defect for the sanitizer self-test (issue 9): thread 0 of every block writes
  // an element 64 elements past the end of the block's shared memory (its dynamic buffers are
  // all of it), so compute-sanitizer memcheck reports an invalid __shared__ write. Never define
  // it in a release build.
  if (threadIdx.x == 0) {
    volatile A* past_end = smem + kFSmemBytes<T> / sizeof(A) + 64;
    *past_end = A(0);
  }
#endif

  const int64_t block = blockIdx.x;
  const int tx = static_cast<int>(block % tiles_x);
  const int64_t rest = block / tiles_x;
  const int ty = static_cast<int>(rest % tiles_y);
  const int64_t plane = rest / tiles_y;
  const int R0 = ty * kFStrip + base;
  const int C0 = tx * kFCols + base;
  const int tid = threadIdx.x;

  // Vertical role: input column ci, rows from ri0.
  const int64_t plane_px = static_cast<int64_t>(height) * width;
  const int ci = C0 - kHalf + tid;
  const bool col_in = ci >= 0 && ci < width;
  const T* xcol = img1 + plane * plane_px + (col_in ? ci : 0);
  const T* ycol = img2 + plane * plane_px + (col_in ? ci : 0);
  const int ri0 = R0 - kHalf;
  T* map_plane = kMean ? nullptr : map + plane * (static_cast<int64_t>(out_h) * out_w);
  // Blocks inside the image (all but those of the edges) take the unchecked path: every row
  // they fetch lies inside (which with kHalf >= the padding's offset also keeps every map row of
  // the tile inside the map), and so does every column their threads read (and so every map
  // column).
  const bool small = plane_px <= int64_t{0x7fffffff};
  if (small && ri0 >= 0 && ri0 + kFFetched<T> <= height && C0 - kHalf >= 0 &&
      C0 - kHalf + kFT <= width) {
    forward_rows<T, kMean, Tile::kInterior>(xcol, ycol, col_in, ri0, height, width, R0, C0,
                                            offset, out_h, out_w, map_plane, smem);
  } else if (small) {
    forward_rows<T, kMean, Tile::kEdge>(xcol, ycol, col_in, ri0, height, width, R0, C0, offset,
                                        out_h, out_w, map_plane, smem);
  } else {
    forward_rows<T, kMean, Tile::kHugeEdge>(xcol, ycol, col_in, ri0, height, width, R0, C0,
                                            offset, out_h, out_w, map_plane, smem);
  }
  if constexpr (kMean) {  // the strip's cells, from their batches' warp sums
    __syncthreads();
    const int band = (R0 - kCellShift) / kCellRows + tid;
    if (tid < kFStrip / kCellRows && band < bands) {
      partials[(plane * bands + band) * segs + tx] =
          cell_sum(smem + kFBufs * kFBufElems + tid * kCellWarps);
    }
  }
}

// Second stage of the mean: out[0] = (sum of the cells) * scale, in float64, in a fixed order
// (thread i adds cells i, i + kMeanThreads, ...; then a fixed tree): bitwise reproducible, and
// the same whichever kernel wrote the cells.
constexpr int kMeanThreads = 1024;

template <typename T>
__global__ void __launch_bounds__(kMeanThreads)
    ssim_mean_kernel(const acc_t<T>* __restrict__ partials,  // [count]
                     int64_t count, double scale,
                     T* __restrict__ out) {  // [1]
  __shared__ double sums[kMeanThreads];
  double s = 0.0;
#pragma unroll 4
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
  const bool mean = partials != nullptr;
  const TileGrid grid = forward_grid<T>(geo, mean);
  const CellGrid cells = cell_grid(geo);
  const auto blocks = static_cast<unsigned>(geo.planes * grid.tiles_x * grid.tiles_y);
  const T* x = static_cast<const T*>(img1);
  const T* y = static_cast<const T*>(img2);
  const auto kernel = mean ? ssim_forward_kernel<T, true> : ssim_forward_kernel<T, false>;
  if (const cudaError_t err = prepare(kernel, kFSmemBytes<T>); err != cudaSuccess) return err;
  kernel<<<blocks, kFT, kFSmemBytes<T>, stream>>>(
      x, y, geo.height, geo.width, geo.out_height(), geo.out_width(), geo.offset(),
      mean ? kCellShift : geo.offset(), grid.tiles_x, grid.tiles_y, cells.bands, cells.segs,
      static_cast<T*>(map), static_cast<A*>(partials));
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

int64_t forward_blocks(Dtype dtype, const Geometry& geo, bool mean) {
  const TileGrid g = dtype == Dtype::kFloat64 ? forward_grid<double>(geo, mean)
                                              : forward_grid<float>(geo, mean);
  return geo.planes * g.tiles_x * g.tiles_y;
}

int64_t mean_cells(const Geometry& geo) {
  const CellGrid c = cell_grid(geo);
  return geo.planes * c.bands * c.segs;
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
