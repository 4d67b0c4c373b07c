// Fused SSIM backward kernel (recomputing the forward's moments) and its launcher; the design
// and the backward math are described at the top of ssim_cuda.cu, the device functions shared
// with the forward are in ssim_device.cuh.

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

// Resident backward blocks per multiprocessor bound (2 blocks of 256 threads at <= 128
// registers: 16 warps per SM, as the 4 blocks of 128 threads measured best on H200,
// 2026-11-24).
#ifndef GPUCHECK_SSIM_BBLOCKS
#define GPUCHECK_SSIM_BBLOCKS 2
#endif

// Backward, in the forward's layout. Block = (plane, strip of `strip_rows` gradient rows,
// kBCols = 232 gradient columns: two cells of the mean), kBT = 256 threads; everything moves
// in batches of kBBatch rows, with two barriers per batch:
//   1. moments, vertical pass (thread t owns input column c0 - 10 + t): rows streamed from
//      global memory (prefetched kBPre rows ahead), the last 11 rows' quantities in a register
//      ring, the vertically filtered batch written to `vbuf`;
//   2. moments, horizontal pass (thread (b, g): row b of the batch, partial columns
//      4g .. 4g + 3, 16-byte shared loads), then the four weighted partials g dS/dmoment of
//      those 4 pixels (zero outside the map), written to `pring`, a ring of kBPRows rows of
//      partial columns, each column's 4 partials in 16 bytes (at column swizzled(c), so that
//      neither the stores of 4 consecutive columns per thread nor stage 3's loads of one column
//      per thread conflict on shared-memory banks); with
//      `partials`, their SSIM values added up for the two cells of the mean in the cells' order
//      (ssim_device.cuh: the cells' groups are these groups, and lane l = 29 b + g of threads
//      128 c .. 128 c + 127 holds group g of cell c; the 12 groups right of the cells go to
//      threads 116 .. 127), each warp's sum kept in shared memory, the cells written at the end;
//   3. partials, vertical pass (thread t owns partial column t), 4 gradient rows at once from
//      the 14 partial rows they need (one 16-byte load each), written to `v2`;
//   4. partials, horizontal pass (thread (b, g): gradient row b of the batch, columns
//      4g .. 4g + 3), then the gradient from the images at those pixels.
// Iteration k runs 1 on batch k, barrier, 2 on batch k and 4 on gradient batch k - 4,
// barrier, 3 on gradient batch k - 3. Streamed row s is image row r0 - 10 + s, partial row p
// image row r0 - 5 + p (batch k of partial rows: row k / 4 of the block's cells), gradient row
// q image row r0 + q.
constexpr int kBT = 256;                        // threads per block
constexpr int kBWarps = kBT / 32;
constexpr int kBCells = 2;                      // cells of the mean across the block
constexpr int kBCols = kBCells * kCellCols;     // gradient columns per block (232)
constexpr int kBGroups = kBCols / 4;            // 58
constexpr int kBPCols = 244;                    // partial columns (>= kBCols + 10; 61 groups)
constexpr int kBPGroups = kBPCols / 4;          // 61
constexpr int kBInCols = kBPCols + 2 * kHalf;   // 254 input columns
constexpr int kBBatch = kBatchRows;             // rows per batch
constexpr int kRing = 12;                       // register ring of input rows (>= kWin)
constexpr int kBPre = 4;                        // rows of register prefetch
constexpr int kBPRows = 16;                     // shared ring of partial rows
constexpr int kBPitch = 256;                    // shared row pitch (columns)
constexpr int kBMaxRows = 128;                  // gradient rows per block, at most
constexpr int kBBufElems = kBBatch * 4 * kBPitch;               // vbuf and v2
constexpr int kBWarpSums = kBMaxRows / kCellRows * kBWarps;     // [cell row][warp]
constexpr int kBSmemElems = 2 * kBBufElems + kBPRows * 4 * kBPitch + kBWarpSums;
static_assert(kBInCols <= kBT, "one input column per thread");
static_assert(kBPCols >= kBCols + 2 * kHalf && kBPCols <= kBT, "partials of the gradient tile");
static_assert(kBPGroups * kBBatch <= kBT && kBGroups * kBBatch <= kBT, "one group per thread");
static_assert(4 * (kBPGroups - 1) + 16 <= kBPitch, "16-value reads stay in the row");
static_assert(4 * (kBGroups - 1) + 16 <= kBPCols, "16-value reads stay in the partials");
static_assert(kRing == 3 * kBBatch && kBBatch % kBPre == 0, "ring slots");
static_assert(kBPRows == 4 * kBBatch, "partial ring: 4 batches, slot of stage 3 per jb % 4");
static_assert(kBT == kBCells * 32 * kCellWarps, "one cell's lanes per 128 threads");
static_assert(kBPCols == kBCols + 4 * (32 * kCellWarps - kCellGroups * kBBatch) / kBBatch &&
                  kHalf == -kCellShift,
              "stage 2: the cells' groups from partial column 0, 12 groups more in lanes "
              "116 .. 127 of the first cell");
static_assert(kBMaxRows % kCellRows == 0, "whole cells");

// float/half/bf16: <= 128 registers (2 blocks = 16 warps per SM); float64: twice the ring.
template <typename T>
constexpr int kBMinBlocks = std::is_same_v<T, double> ? 1 : GPUCHECK_SSIM_BBLOCKS;

// Where partial column c sits in its row of `pring` (16-byte units): c with its two low bits
// XORed by bits 3-4, a permutation within each aligned group of 8 columns. Stage 2 stores
// columns 4 g .. 4 g + 3 from thread g, stage 3 loads column t in thread t: in both, the 8
// threads of a quarter warp (one shared-memory wavefront of 16-byte accesses) reach 8 different
// groups of 4 banks.
__device__ __forceinline__ int swizzled(int c) { return c ^ ((c >> 3) & 3); }

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
                         int tiles_y, int strip_rows, int bands, int segs,
                         T* __restrict__ grad1,             // [planes, H, W]
                         T* __restrict__ grad2,             // [planes, H, W] or null
                         acc_t<T>* __restrict__ partials) {  // [planes, bands, segs] or null
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* const vbuf = reinterpret_cast<A*>(smem_raw);  // [kBBatch][4 moments][kBPitch]
  A* const v2 = vbuf + kBBufElems;                 // [kBBatch][4 partials][kBPitch]
  A* const pring = v2 + kBBufElems;                // [kBPRows][kBPitch swizzled][4 partials]
  A* const wsum = pring + kBPRows * 4 * kBPitch;   // [cell row][cell][warp of the cell]

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
  // Role 2: row hb of a batch, partial columns 4 hg .. (map column of the first: pmc0).
  // Thread 128 c + l: lane l = 29 b + g of cell c (hb = b, hg = 29 c + g) for l < 116, and
  // l = 116 + 3 b + j (c = 0) group 58 + j, right of the cells.
  const int c2 = tid / (32 * kCellWarps);
  const int l2 = tid - c2 * 32 * kCellWarps;
  const bool in_cell = l2 < kCellGroups * kBBatch;
  const int extra = l2 - kCellGroups * kBBatch;
  const int hb = in_cell ? l2 / kCellGroups : extra / 3;
  const int hg = in_cell ? kCellGroups * c2 + l2 % kCellGroups : kBCells * kCellGroups + extra % 3;
  const bool on2 = in_cell || c2 == 0;
  const int pmc0 = c0 - kHalf + 4 * hg - offset;
  // Role 3: partial column tid. Role 4: gradient row gb of a batch, columns gcol ...
  const bool on3 = tid < kBPCols;
  const int gb = tid / kBGroups;
  const int gg = tid - gb * kBGroups;
  const bool on4 = tid < kBGroups * kBBatch;
  const int gcol = c0 + 4 * gg;
  CellLane<A> lane;  // with partials: the thread's lane of its cell
  // 4-element accesses: rows of whole groups and 4-element aligned tensors (an input may be
  // a view with any storage offset).
  constexpr uintptr_t kMisaligned = 4 * sizeof(T) - 1;
  const bool aligned = ((reinterpret_cast<uintptr_t>(img1) | reinterpret_cast<uintptr_t>(img2) |
                         reinterpret_cast<uintptr_t>(grad1) | reinterpret_cast<uintptr_t>(grad2)) &
                        kMisaligned) == 0;
  const bool g_vec = aligned && width % 4 == 0 && gcol + 3 < width;
  const bool need2 = grad2 != nullptr;
  const bool cells = partials != nullptr;

  const T* const grad_plane =
      kScalarGrad ? grad : grad + plane * (static_cast<int64_t>(out_h) * out_w);
  // Twice the upstream gradient per map pixel (the partials' factor 2, exact).
  A g2_scalar = A(2) * scale;
  if (kScalarGrad && grad != nullptr) g2_scalar = A(2) * (to_acc(grad[0]) * scale);

  // Rows are fetched in order: fr = image row of the next fetch, xf / yf its column pointers
  // (hidden from the optimizer: one 64-bit add each per row).
  int fr = r0 - 2 * kHalf;
  const T* xf = opaque(x + (col_in ? ci : 0) + static_cast<int64_t>(fr) * width);
  const T* yf = opaque(y + (col_in ? ci : 0) + static_cast<int64_t>(fr) * width);
  auto fetch = [&](T& vx, T& vy) {
    vx = zero<T>();
    vy = zero<T>();
    if (col_in && static_cast<unsigned>(fr) < static_cast<unsigned>(height)) {
      vx = __ldg(xf);
      vy = __ldg(yf);
    }
    ++fr;
    xf += width;
    yf += width;
  };
  T px[kBPre];  // raw elements, converted when used (see the forward)
  T py[kBPre];
#pragma unroll
  for (int u = 0; u < kBPre; ++u) fetch(px[u], py[u]);
  A ring[kRing][4];
  // Streamed row s into ring slot s % kRing; prefetch slot s % kBPre.
  auto push = [&](int slot, int pre) {
    A q[4];
    quantities(to_acc(px[pre]), to_acc(py[pre]), q);
    fetch(px[pre], py[pre]);
#pragma unroll
    for (int m = 0; m < 4; ++m) ring[slot][m] = q[m];
  };
#pragma unroll
  for (int s = 0; s < 2 * kHalf; ++s) push(s, s % kBPre);
  // Stage 1 of batch k (rows 10 + 4k + i): ring slots (10 + 4k + i) % 12, a compile-time
  // constant for each value of k % 3.
  auto stage1 = [&](auto kc) {
    constexpr int kS0 = 2 * kHalf + kBBatch * decltype(kc)::value;  // (10 + 4k) mod 12
    [&]<int... kI>(std::integer_sequence<int, kI...>) {
      (
          [&] {
            constexpr int kSlot = (kS0 + kI) % kRing;
            push(kSlot, (2 * kHalf + kI) % kBPre);
            A v[4];
            vertical_filter<kSlot + kRing - 2 * kHalf>(ring, v);
#pragma unroll
            for (int m = 0; m < 4; ++m) vbuf[(kI * 4 + m) * kBPitch + tid] = v[m];
          }(),
          ...);
    }(std::make_integer_sequence<int, kBBatch>{});
  };

  // Stage 3 of gradient batch jb, whose first partial row sits in ring slot 4 (jb % 4): every
  // slot a compile-time constant.
  const A* const col3 = pring + 4 * swizzled(tid);
  auto stage3 = [&](auto jc) {
    constexpr int kBase = kBBatch * decltype(jc)::value;
    A acc[4][kBBatch];  // [partial][row]
#pragma unroll
    for (int i = 0; i < kBBatch + 2 * kHalf; ++i) {
      A v[4];
      load4(col3 + ((kBase + i) & (kBPRows - 1)) * 4 * kBPitch, v);
#pragma unroll
      for (int r = 0; r < kBBatch; ++r) {
        const int t = i - r;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (t == 0) acc[q][r] = mul(gauss<A>(0), v[q]);
          if (t > 0 && t < kWin) acc[q][r] = fma(gauss<A>(t), v[q], acc[q][r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kBBatch; ++r) {
#pragma unroll
      for (int q = 0; q < 4; ++q) v2[(r * 4 + q) * kBPitch + tid] = acc[q][r];
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
    A cell_s = A(0);         // the lane's SSIM sum of this batch (zero unless in a cell)
    if (on2 && k < last1) {  // stage 2: partial row p
      const int p = kBBatch * k + hb;
      A mom[4][4];  // [moment][pixel]
#pragma unroll
      for (int m = 0; m < 4; ++m) filter4(vbuf + (hb * 4 + m) * kBPitch + 4 * hg, mom[m]);
      const int mr = r0 - kHalf + p - offset;  // map row
      const bool row_ok = static_cast<unsigned>(mr) < static_cast<unsigned>(out_h);
      A part[4][4];  // [partial][pixel]
      A val[4];      // SSIM, zero outside the map
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int mc = pmc0 + i;
        const bool in_map = row_ok && static_cast<unsigned>(mc) < static_cast<unsigned>(out_w);
        A g2 = A(0);
        if (in_map) {
          g2 = kScalarGrad ? g2_scalar
                           : A(2) * to_acc(grad_plane[static_cast<int64_t>(mr) * out_w + mc]);
        }
        const A m4[4] = {mom[0][i], mom[1][i], mom[2][i], mom[3][i]};
        const SsimTerms<A> t = ssim_terms(m4);
        const A inv = ssim_inverse(t);
        const A ssim = ssim_value(t, inv);
        const A da = t.a2 - t.a1;
        const A db = ssim * (t.b2 - t.b1);
        const A gi2 = g2 * inv;
        part[0][i] = gi2 * (m4[1] * da - m4[0] * db);  // g dS/dmu1
        part[1][i] = gi2 * (m4[0] * da - m4[1] * db);  // g dS/dmu2
        part[2][i] = -gi2 * (ssim * t.b1);             // 2 g dS/dE[x² + y²]
        part[3][i] = gi2 * t.a1;                       // g dS/dE[xy]
        val[i] = in_map ? ssim : A(0);
      }
      A* dst = pring + ((p & (kBPRows - 1)) * kBPitch + 4 * hg) * 4;  // swizzled(4 hg + i) =
      const int sw = (hg >> 1) & 3;                                     // 4 hg + (i ^ sw)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const A v[4] = {part[0][i], part[1][i], part[2][i], part[3][i]};
        store4(dst + 4 * (i ^ sw), v);
      }
      if (in_cell) cell_s = add(add(val[0], val[1]), add(val[2], val[3]));
    }
    if (cells && k < batches) {  // every thread: its lane's share of cell row k / 4
      lane.add(k % kCellBatches, cell_s, wsum + k / kCellBatches * kBWarps + c2 * kCellWarps,
                     l2 >> 5);
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
          d1[i] = fma(yv, f[3][i], fma(xv, f[2][i], f[0][i]));
          d2[i] = fma(xv, f[3][i], fma(yv, f[2][i], f[1][i]));
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
  if (cells) {  // the strip's cells, from their batches' warp sums
    __syncthreads();
    const int j = tid / kBCells;  // cell row of the strip
    const int c = tid - j * kBCells;
    const int band = r0 / kCellRows + j;  // partial rows from r0 - 5 = 16 band + kCellShift
    const int seg = kBCells * tx + c;
    if (j < strip_rows / kCellRows && band < bands && seg < segs) {
      partials[(plane * bands + band) * segs + seg] = cell_sum(wsum + j * kBWarps + c * kCellWarps);
    }
  }
}

// Resident backward blocks per multiprocessor (float32/16-bit: the launch bound above).
constexpr int kBResident = GPUCHECK_SSIM_BBLOCKS;

// Gradient rows per backward block (a multiple of kCellRows). Model: a block's time is
// proportional to the rows it streams (rows + 16: the 20-row halo less the last partial
// batch, which only finishes the pipeline) and blocks run in waves of kBResident per
// multiprocessor, so a call costs ceil(blocks / slots) * (rows + 16); the cheapest wins
// (ties: the longer strip). E.g. on 132 multiprocessors: 128 rows at 5x3x1080x1920 (1215
// blocks, 4.6 waves) and at 1x3x1080x1920 (243 blocks, one wave). Defining
// GPUCHECK_SSIM_BROWS fixes it.
int backward_strip(const Geometry& g) {
#ifdef GPUCHECK_SSIM_BROWS
  static_assert(GPUCHECK_SSIM_BROWS % kCellRows == 0 && GPUCHECK_SSIM_BROWS <= kBMaxRows,
                "whole cells");
  return GPUCHECK_SSIM_BROWS;
#else
  const int64_t slots = static_cast<int64_t>(multiprocessors()) * kBResident;
  const int64_t columns = g.planes * ceil_div(g.width - kCellShift, kBCols);
  int best_rows = kBMaxRows;
  int64_t best_cost = -1;
  for (int rows = kBMaxRows; rows >= kCellRows; rows -= kCellRows) {
    const int64_t blocks = columns * ceil_div(g.height - kCellShift, rows);
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
  // Over every window centre and cell: from image column -5 (kCellShift) on (a block's cells
  // start 5 columns left of its gradient columns).
  return {ceil_div(g.width - kCellShift, kBCols), ceil_div(g.height - kCellShift, rows), rows};
}

template <typename T>
cudaError_t backward_typed(const void* grad, bool grad_is_scalar, double scale, const void* img1,
                           const void* img2, const Geometry& geo, void* grad1, void* grad2,
                           void* partials, cudaStream_t stream) {
  using A = acc_t<T>;
  const BackwardGrid grid = backward_grid(geo);
  const CellGrid cells = cell_grid(geo);
  const int64_t blocks = geo.planes * grid.tiles_x * grid.tiles_y;
  const size_t smem = kBSmemElems * sizeof(A);
  const auto kernel = grad_is_scalar ? ssim_backward_kernel<T, true> : ssim_backward_kernel<T, false>;
  if (const cudaError_t err = prepare(kernel, smem); err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(blocks), kBT, smem, stream>>>(
      static_cast<const T*>(grad), static_cast<A>(scale), static_cast<const T*>(img1),
      static_cast<const T*>(img2), geo.height, geo.width, geo.out_height(), geo.out_width(),
      geo.offset(), grid.tiles_x, grid.tiles_y, grid.rows, cells.bands, cells.segs,
      static_cast<T*>(grad1), static_cast<T*>(grad2), static_cast<A*>(partials));
  return cudaSuccess;
}

}  // namespace

int64_t backward_blocks(const Geometry& geo) {
  const BackwardGrid g = backward_grid(geo);
  return geo.planes * g.tiles_x * g.tiles_y;
}

cudaError_t launch_backward(Dtype dtype, const void* grad, bool grad_is_scalar, double scale,
                            const void* img1, const void* img2, const Geometry& geo, void* grad1,
                            void* grad2, void* partials, cudaStream_t stream) {
  switch (dtype) {
    case Dtype::kFloat32:
      return backward_typed<float>(grad, grad_is_scalar, scale, img1, img2, geo, grad1, grad2,
                                   partials, stream);
    case Dtype::kFloat16:
      return backward_typed<__half>(grad, grad_is_scalar, scale, img1, img2, geo, grad1, grad2,
                                    partials, stream);
    case Dtype::kBFloat16:
      return backward_typed<__nv_bfloat16>(grad, grad_is_scalar, scale, img1, img2, geo, grad1,
                                           grad2, partials, stream);
    case Dtype::kFloat64:
      return backward_typed<double>(grad, grad_is_scalar, scale, img1, img2, geo, grad1, grad2,
                                    partials, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gpucheck::ssim
