// Exact k-nearest-neighbour mean squared distance: kernels and launchers (issue 4).
//
// Algorithm (all on the GPU, O(N log N) work for the build, about O(N) for the queries):
//  1. bounds: bounding box of the cloud, the first non-finite row (host checks it) and a
//     strided sample of 1024 points, from which the host takes a robust box (2.5 / 97.5 %
//     quantiles per axis) and chooses the grid of the sort keys (knn.h, Grid):
//     - ordinary clouds: a cubic 2^21 grid over the bounding box, 63-bit Morton codes;
//     - clouds with far outliers (bounding box > 8x the robust box): the resolution of a grid
//       over the bounding box would be spent on empty space and the dense core would fall into
//       a few cells, in no spatial order. Instead each point gets a class: the smallest of 8
//       nested cubes around the robust box, growing geometrically up to the bounding box, that
//       holds it; the key is the class, then the Morton code on a 2^20 grid over that cube.
//  2. morton: the keys; cub radix sort of (key, index) pairs.
//  3. gather: points in key order as float4 (x, y, z, original index bits); every class starts
//     a new leaf (the slots up to the next multiple of 32 are padding), so no leaf mixes the
//     core with outliers; every 32 consecutive slots form a leaf with its bounding box.
//  4. levels: an implicit 32-ary tree over the leaves (node j of level l bounds nodes
//     [32 j, 32 j + 32) of level l - 1) up to a single root.
//  5. query: one warp per leaf, one lane per query point, so a warp's 32 queries are close in
//     space and the warp walks the tree together: first the top-k of each lane is seeded with
//     the other points of its own leaf; then a depth-first walk visits children nearest first
//     (lower bound: distance between the child box and the box of the warp's queries) and
//     stops a level as soon as the nearest remaining child is farther than the largest
//     current k-th distance in the warp. At the leaves each lane tests the leaf box against
//     its own k-th distance and the warp scans the leaf (32 points staged in shared memory)
//     when any lane needs it. A warp whose queries are far apart (a leaf of scattered
//     outliers: its query box holds the core, so nothing prunes) would visit the whole tree;
//     after `budget` steps it gives up and defers its queries to a second kernel, which runs
//     them one per warp, each with the box of its own point, all in parallel. Warps are
//     launched last leaf first, so such warps (the outer classes) give up early.
//
// Exactness: every distance is computed from coordinate differences of the input floats with
// the same fixed sequence of round-to-nearest operations (sub, mul, fma, fma), and every box
// bound uses that same sequence on per-axis gaps that are never larger than the point's, so
// a pruned box cannot hold a point that would enter the top-k (rounding is monotonic). The
// result is the exact k smallest of the float32 distances, averaged in float32; the order of
// the points and the walk only change the speed. A squared distance above the float32 range
// (coordinates ~1e19 apart or more) is +inf, so is the mean of k distances holding one.
#include "knn/knn.h"

#include <cub/cub.cuh>
#include <cuda/std/limits>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <utility>

namespace gpucheck::knn {
namespace {

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr uint32_t kNoKey = 0xFFFFFFFFu;
constexpr int kBoundsThreads = 256;
constexpr int kBoundsMaxBlocks = 1024;
constexpr int kGatherThreads = 256;
constexpr int kLevelThreads = 256;
constexpr int kQueryWarps = 4;
constexpr int kQueryThreads = kQueryWarps * 32;
constexpr int kDeferredMaxBlocks = 1024;  // grid-stride over the deferred queries
constexpr float kInf = cuda::std::numeric_limits<float>::infinity();

// Order-preserving map float -> uint32 (for atomicMin/atomicMax on floats).
__host__ __device__ inline uint32_t float_key(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__host__ __device__ inline float key_float(uint32_t k) {
  const uint32_t u = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// Squared length of (dx, dy, dz) with one fixed sequence of rounded operations, so that the
// same per-axis magnitudes always give the same result and larger ones never a smaller one.
__device__ __forceinline__ float sq_norm(float dx, float dy, float dz) {
  return __fmaf_rn(dz, dz, __fmaf_rn(dy, dy, __fmul_rn(dx, dx)));
}

__device__ __forceinline__ float point_dist(const float4& q, const float4& p) {
  return sq_norm(__fsub_rn(q.x, p.x), __fsub_rn(q.y, p.y), __fsub_rn(q.z, p.z));
}

// Lower bound of the distance from q to any point in [lo, hi] (0 inside).
__device__ __forceinline__ float box_dist(const float4& q, const float4& lo, const float4& hi) {
  const float dx = fmaxf(fmaxf(__fsub_rn(lo.x, q.x), __fsub_rn(q.x, hi.x)), 0.0f);
  const float dy = fmaxf(fmaxf(__fsub_rn(lo.y, q.y), __fsub_rn(q.y, hi.y)), 0.0f);
  const float dz = fmaxf(fmaxf(__fsub_rn(lo.z, q.z), __fsub_rn(q.z, hi.z)), 0.0f);
  return sq_norm(dx, dy, dz);
}

// Lower bound of the distance between any point of box a and any point of box b.
__device__ __forceinline__ float box_box_dist(const float4& alo, const float4& ahi,
                                              const float4& blo, const float4& bhi) {
  const float dx = fmaxf(fmaxf(__fsub_rn(blo.x, ahi.x), __fsub_rn(alo.x, bhi.x)), 0.0f);
  const float dy = fmaxf(fmaxf(__fsub_rn(blo.y, ahi.y), __fsub_rn(alo.y, bhi.y)), 0.0f);
  const float dz = fmaxf(fmaxf(__fsub_rn(blo.z, ahi.z), __fsub_rn(alo.z, bhi.z)), 0.0f);
  return sq_norm(dx, dy, dz);
}

__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

__device__ __forceinline__ float4 shfl4(const float4& v, int src) {
  return make_float4(__shfl_sync(kFullMask, v.x, src), __shfl_sync(kFullMask, v.y, src),
                     __shfl_sync(kFullMask, v.z, src), 0.0f);
}

// ---------------------------------------------------------------------------------------------
// 1. bounds
// ---------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(kBoundsThreads)
    bounds_kernel(const float* __restrict__ points, int n, uint32_t* __restrict__ bounds,
                  float* __restrict__ sample, int n_sample, int stride) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;  // the grid covers n_sample threads
  if (t < n_sample) {
    const float* r = points + 3 * static_cast<int64_t>(t) * stride;
    sample[3 * t] = r[0];
    sample[3 * t + 1] = r[1];
    sample[3 * t + 2] = r[2];
  }
  float lo[3] = {kInf, kInf, kInf};
  float hi[3] = {-kInf, -kInf, -kInf};
  uint32_t bad = kNoKey;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float* r = points + 3 * static_cast<int64_t>(i);
    const float c[3] = {r[0], r[1], r[2]};
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      if (!isfinite(c[a])) bad = min(bad, static_cast<uint32_t>(i));
      lo[a] = fminf(lo[a], c[a]);
      hi[a] = fmaxf(hi[a], c[a]);
    }
  }
  __shared__ uint32_t s_words[kBoundsThreads / 32][kBoundsWords];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  uint32_t words[kBoundsWords];
#pragma unroll
  for (int a = 0; a < 3; ++a) {
    words[a] = float_key(warp_min(lo[a]));
    words[3 + a] = ~float_key(warp_max(hi[a]));
  }
  words[6] = __reduce_min_sync(kFullMask, bad);
  if (lane == 0) {
#pragma unroll
    for (int w = 0; w < kBoundsWords; ++w) s_words[warp][w] = words[w];
  }
  __syncthreads();
  if (threadIdx.x < kBoundsWords) {
    uint32_t v = kNoKey;
    for (int w = 0; w < kBoundsThreads / 32; ++w) v = min(v, s_words[w][threadIdx.x]);
    atomicMin(&bounds[threadIdx.x], v);
  }
}

// ---------------------------------------------------------------------------------------------
// 2. Morton codes
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint64_t spread3(uint32_t v) {
  uint64_t x = v & 0x1FFFFFu;
  x = (x | (x << 32)) & 0x001F00000000FFFFull;
  x = (x | (x << 16)) & 0x001F0000FF0000FFull;
  x = (x | (x << 8)) & 0x100F00F00F00F00Full;
  x = (x | (x << 4)) & 0x10C30C30C30C30C3ull;
  x = (x | (x << 2)) & 0x1249249249249249ull;
  return x;
}

template <int kCellBits>
__device__ __forceinline__ uint32_t quantise(float c, float origin, float scale) {
  constexpr float kMaxCell = static_cast<float>((1u << kCellBits) - 1u);
  return static_cast<uint32_t>(fminf(fmaxf(__fsub_rn(c, origin) * scale, 0.0f), kMaxCell));
}

template <int kCellBits>
__device__ __forceinline__ uint64_t morton(const float* r, float3 origin, float scale) {
  const uint32_t x = quantise<kCellBits>(r[0], origin.x, scale);
  const uint32_t y = quantise<kCellBits>(r[1], origin.y, scale);
  const uint32_t z = quantise<kCellBits>(r[2], origin.z, scale);
  return (spread3(x) << 2) | (spread3(y) << 1) | spread3(z);
}

// Class of a point on the split grid: 0 inside the core cube, else the smallest c with
// |p - center|_inf <= h0 f^c, at most kClasses - 1 (rounding only moves a point by a class,
// which changes the order, never the result).
__device__ __forceinline__ int point_class(const float* r, const Grid& g) {
  const float d = fmaxf(fmaxf(fabsf(__fsub_rn(r[0], g.center.x)),
                              fabsf(__fsub_rn(r[1], g.center.y))),
                        fabsf(__fsub_rn(r[2], g.center.z)));
  if (d <= g.h0) return 0;
  const float c = ceilf(log2f(d / g.h0) * g.inv_log2_f);  // may be +inf: clamped first
  return static_cast<int>(fminf(fmaxf(c, 1.0f), static_cast<float>(kClasses - 1)));
}

__global__ void morton_kernel(const float* __restrict__ points, int n, const Grid grid,
                              uint64_t* __restrict__ keys, int32_t* __restrict__ order) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* r = points + 3 * static_cast<int64_t>(i);
  if (grid.classes == 1) {
    keys[i] = morton<21>(r, grid.origin[0], grid.scale[0]);
  } else {
    const int c = point_class(r, grid);
    keys[i] = (static_cast<uint64_t>(c) << 60) | morton<20>(r, grid.origin[c], grid.scale[c]);
  }
  order[i] = i;
}

// One warp: lane c <= kClasses finds the first sorted position of class c (binary search);
// a prefix sum over the lanes then lays the classes out on leaf boundaries.
__global__ void layout_kernel(const uint64_t* __restrict__ keys, int n,
                              int32_t* __restrict__ layout) {
  const int c = threadIdx.x;
  int start = n;
  if (c <= kClasses) {
    const uint64_t want = static_cast<uint64_t>(c) << 60;
    int lo = 0;
    int hi = n;
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (keys[mid] < want) lo = mid + 1; else hi = mid;
    }
    start = c == kClasses ? n : lo;
    layout[c] = start;
  }
  const int next = __shfl_down_sync(kFullMask, start, 1);
  const int count = next - start;
  int padded = (count + kLeafSize - 1) / kLeafSize * kLeafSize;
  if (c >= kClasses) padded = 0;
  // exclusive prefix sum of the padded counts over lanes 0..kClasses
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(kFullMask, padded, o);
    if (c >= o) padded += v;
  }
  const int excl = __shfl_up_sync(kFullMask, padded, 1);
  if (c <= kClasses) layout[kClasses + 1 + c] = c == 0 ? 0 : excl;
}

// ---------------------------------------------------------------------------------------------
// 3./4. sorted points, leaf boxes, inner levels
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void warp_box(float4 lo, float4 hi, float4* out_lo, float4* out_hi,
                                         int slot) {
  lo.x = warp_min(lo.x);
  lo.y = warp_min(lo.y);
  lo.z = warp_min(lo.z);
  hi.x = warp_max(hi.x);
  hi.y = warp_max(hi.y);
  hi.z = warp_max(hi.z);
  if ((threadIdx.x & 31) == 0) {
    out_lo[slot] = make_float4(lo.x, lo.y, lo.z, 0.0f);
    out_hi[slot] = make_float4(hi.x, hi.y, hi.z, 0.0f);
  }
}

__global__ void __launch_bounds__(kGatherThreads)
    gather_kernel(const float* __restrict__ points, const int32_t* __restrict__ order, int n,
                  const int32_t* __restrict__ layout, int slots, float4* __restrict__ sorted,
                  float4* __restrict__ leaf_lo, float4* __restrict__ leaf_hi) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;  // blockDim % 32 == 0: warp == leaf
  if (s - (threadIdx.x & 31) >= slots) return;          // whole warp past the end
  int i = -1;                                           // sorted point in slot s, if any
  if (layout == nullptr) {
    if (s < n) i = s;
  } else if (s < slots) {
    int c = 0;
#pragma unroll
    for (int t = 1; t < kClasses; ++t) c = s >= __ldg(layout + kClasses + 1 + t) ? t : c;
    const int local = s - __ldg(layout + kClasses + 1 + c);
    if (local < __ldg(layout + c + 1) - __ldg(layout + c)) i = __ldg(layout + c) + local;
  }
  float4 lo = make_float4(kInf, kInf, kInf, 0.0f);
  float4 hi = make_float4(-kInf, -kInf, -kInf, 0.0f);
  if (i >= 0) {
    const int o = order[i];
    const float* r = points + 3 * static_cast<int64_t>(o);
    const float4 p = make_float4(r[0], r[1], r[2], __int_as_float(o));
    sorted[s] = p;
    lo = p;
    hi = p;
  } else if (s < slots) {
    sorted[s] = make_float4(kInf, kInf, kInf, __int_as_float(-1));
  }
  warp_box(lo, hi, leaf_lo, leaf_hi, s / kLeafSize);
}

__global__ void __launch_bounds__(kLevelThreads)
    level_kernel(const float4* __restrict__ child_lo, const float4* __restrict__ child_hi,
                 int n_child, float4* __restrict__ lo, float4* __restrict__ hi) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c - (threadIdx.x & 31) >= n_child) return;
  float4 l = make_float4(kInf, kInf, kInf, 0.0f);
  float4 h = make_float4(-kInf, -kInf, -kInf, 0.0f);
  if (c < n_child) {
    l = child_lo[c];
    h = child_hi[c];
  }
  warp_box(l, h, lo, hi, c / kFanout);
}

// ---------------------------------------------------------------------------------------------
// 5. queries
// ---------------------------------------------------------------------------------------------
// best[] is sorted ascending; d < best[K - 1] is inserted, the largest entry drops out.
template <int K>
__device__ __forceinline__ void insert(float (&best)[K], float d) {
#pragma unroll
  for (int j = K - 1; j > 0; --j) best[j] = (d < best[j - 1]) ? best[j - 1] : fminf(d, best[j]);
  best[0] = fminf(d, best[0]);
}

// Scans the 32 staged points (padding slots hold +inf coordinates, so their distance is +inf
// and never enters). `self` is the slot to skip (-1: none).
template <int K>
__device__ __forceinline__ void scan(const float4* __restrict__ s, const float4& q, int self,
                                     float (&best)[K]) {
#pragma unroll 8
  for (int j = 0; j < kLeafSize; ++j) {
    const float d = point_dist(q, s[j]);
    if (d < best[K - 1] && j != self) insert(best, d);
  }
}

// Sort key of a child for the nearest-first walk: its lower-bound distance with the low 5 bits
// replaced by the lane (rounds the bound down, so it stays a lower bound), or kNoKey if pruned.
__device__ __forceinline__ uint32_t child_key(float d, float r2, int lane) {
  return d < r2 ? ((__float_as_uint(d) & ~31u) | static_cast<uint32_t>(lane)) : kNoKey;
}

// The queries of one leaf: all its points (single < 0), or only the one in lane `single`
// (the box of the walk is then that point alone). Returns false, having written nothing, when
// the walk took more than `budget` steps; *real_lanes: the lanes that hold points.
template <int K>
__device__ __forceinline__ bool query_leaf(const float4* __restrict__ pts, const Tree& tree,
                                           int leaf, int single, int budget,
                                           float* __restrict__ out, float4* stage,
                                           uint32_t (*stack)[32], unsigned* real_lanes) {
  const int lane = threadIdx.x & 31;
  const float4 own = pts[leaf * kLeafSize + lane];
  const bool real = __float_as_int(own.w) >= 0;
  *real_lanes = __ballot_sync(kFullMask, real);
  if (*real_lanes == 0) return true;  // an empty leaf (padding); warp-uniform
  // A class's real points come first in its leaves, so lane 0 is real; padding lanes take its
  // point (they never vote and never widen r2 or the query box).
  const float4 first = shfl4(own, 0);
  const float4 q = real ? own : first;
  const bool active = single < 0 ? real : lane == single;

  // Seed: the top-k of the active lanes from the other points of the own leaf (padding slots
  // hold +inf coordinates: their distance is +inf and never enters); inactive lanes get zeros,
  // so they never vote, never widen r2 and never take a point.
  stage[lane] = own;
  __syncwarp();
  float best[K];
#pragma unroll
  for (int j = 0; j < K; ++j) best[j] = kInf;
  scan<K>(stage, q, lane, best);
  if (!active) {
#pragma unroll
    for (int j = 0; j < K; ++j) best[j] = 0.0f;
  }

  if (tree.top > 0) {
    // Box of the queries (warp-uniform branch).
    float4 qlo;
    float4 qhi;
    if (single < 0) {
      qlo = make_float4(warp_min(q.x), warp_min(q.y), warp_min(q.z), 0.0f);
      qhi = make_float4(warp_max(q.x), warp_max(q.y), warp_max(q.z), 0.0f);
    } else {
      qlo = shfl4(q, single);
      qhi = qlo;
    }
    float r2 = __uint_as_float(__reduce_max_sync(kFullMask, __float_as_uint(best[K - 1])));
    int level = tree.top;  // level of `node`; its children live at level - 1
    int node = 0;
    float4 clo = qlo;  // this lane's child box (read at level 1, whose children are leaves)
    float4 chi = qhi;
    auto load_children = [&]() -> uint32_t {
      const int c = node * kFanout + lane;
      if (c >= tree.count[level - 1]) return kNoKey;
      clo = tree.lo[level - 1][c];
      chi = tree.hi[level - 1][c];
      return child_key(box_box_dist(qlo, qhi, clo, chi), r2, lane);
    };
    uint32_t key = load_children();
    int steps = budget;
    while (true) {
      if (--steps < 0) return false;  // warp-uniform
      const uint32_t kmin = __reduce_min_sync(kFullMask, key);
      // Keys are lower bounds sorted by the min-reduction: once the nearest remaining child
      // is not closer than r2 (which only shrinks), none of the others at this level is either.
      if (kmin == kNoKey || !(__uint_as_float(kmin & ~31u) < r2)) {
        if (level == tree.top) break;
        ++level;
        node /= kFanout;
        key = stack[level][lane];
        continue;
      }
      const int c = static_cast<int>(kmin & 31u);
      if (lane == c) key = kNoKey;
      const int child = node * kFanout + c;
      if (level > 1) {  // descend into an inner node
        stack[level][lane] = key;
        --level;
        node = child;
        key = load_children();
        continue;
      }
      if (child == leaf) continue;  // the seed already holds the own leaf
      const float4 blo = shfl4(clo, c);
      const float4 bhi = shfl4(chi, c);
      const bool need = active && box_dist(q, blo, bhi) < best[K - 1];
      if (!__any_sync(kFullMask, need)) continue;
      __syncwarp();
      stage[lane] = pts[child * kLeafSize + lane];
      __syncwarp();
      scan<K>(stage, q, -1, best);
      r2 = __uint_as_float(__reduce_max_sync(kFullMask, __float_as_uint(best[K - 1])));
    }
  }

  if (active) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) sum = __fadd_rn(sum, best[j]);
#ifdef GPUCHECK_DEFECT_UNINIT_READ
    // Defect (selftest): reads the output element (never written yet: at::empty) before
    // writing it. The value is loaded (volatile) and kept alive, but changes nothing.
    const float stale = *static_cast<volatile float*>(out + __float_as_int(q.w));
    asm volatile("" ::"f"(stale));
#endif
    out[__float_as_int(q.w)] = __fdiv_rn(sum, static_cast<float>(K));
  }
  return true;
}

// One warp per leaf. A warp whose walk runs out of budget appends its points' slots to
// `deferred` ([0]: count, then slots) for deferred_kernel, so that a leaf of scattered outliers
// costs `budget` steps here instead of a walk over the whole tree.
template <int K>
__global__ void __launch_bounds__(kQueryThreads)
    query_kernel(const float4* __restrict__ pts, const Tree tree, int budget,
                 float* __restrict__ out, int32_t* __restrict__ deferred) {
  __shared__ float4 s_pts[kQueryWarps][kLeafSize];
  __shared__ uint32_t s_keys[kQueryWarps][kMaxLevels][32];
  const int lane = threadIdx.x & 31;
  const int wib = threadIdx.x >> 5;
  // Last leaf first: the outer classes (where warps may run out of budget) start early.
  const int leaf = (gridDim.x - 1 - blockIdx.x) * kQueryWarps + wib;
  if (leaf >= tree.count[0]) return;  // warp-uniform
  unsigned real_lanes = 0;
  if (query_leaf<K>(pts, tree, leaf, -1, budget, out, s_pts[wib], s_keys[wib], &real_lanes)) {
    return;
  }
  int base = 0;
  if (lane == 0) base = atomicAdd(deferred, __popc(real_lanes));
  base = __shfl_sync(kFullMask, base, 0);
  if ((real_lanes >> lane) & 1u) {
    deferred[1 + base + __popc(real_lanes & ((1u << lane) - 1u))] = leaf * kLeafSize + lane;
  }
}

// The deferred queries, one warp per query (grid-stride), each walking with its own point as
// the query box and no budget.
template <int K>
__global__ void __launch_bounds__(kQueryThreads)
    deferred_kernel(const float4* __restrict__ pts, const Tree tree, float* __restrict__ out,
                    const int32_t* __restrict__ deferred) {
  __shared__ float4 s_pts[kQueryWarps][kLeafSize];
  __shared__ uint32_t s_keys[kQueryWarps][kMaxLevels][32];
  const int wib = threadIdx.x >> 5;
  const int count = deferred[0];
  for (int e = blockIdx.x * kQueryWarps + wib; e < count; e += gridDim.x * kQueryWarps) {
    const int slot = deferred[1 + e];
    unsigned real_lanes = 0;
    __syncwarp();  // the previous query's last reads of the staged points are done
    query_leaf<K>(pts, tree, slot / kLeafSize, slot % kLeafSize, INT_MAX, out, s_pts[wib],
                  s_keys[wib], &real_lanes);
  }
}

// budget < 0: the deferred kernel, else the query kernel.
template <int K>
void launch_query_k(const float4* sorted, const Tree& tree, int budget, float* out,
                    int32_t* deferred, cudaStream_t stream) {
  const int blocks = (tree.count[0] + kQueryWarps - 1) / kQueryWarps;
  if (budget >= 0) {
    query_kernel<K><<<blocks, kQueryThreads, 0, stream>>>(sorted, tree, budget, out, deferred);
  } else {
    deferred_kernel<K><<<std::min(blocks, kDeferredMaxBlocks), kQueryThreads, 0, stream>>>(
        sorted, tree, out, deferred);
  }
}

template <int... Ks>
void dispatch_query(int k, const float4* sorted, const Tree& tree, int budget, float* out,
                    int32_t* deferred, cudaStream_t stream, std::integer_sequence<int, Ks...>) {
  // k is validated by the caller (1 <= k <= kMaxK); exactly one branch runs.
  ((k == Ks + 1 ? launch_query_k<Ks + 1>(sorted, tree, budget, out, deferred, stream)
                : void()),
   ...);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers
// ---------------------------------------------------------------------------------------------
void launch_bounds(const float* points, int n, uint32_t* bounds, float* sample, int n_sample,
                   int stride, cudaStream_t stream) {
  const int blocks = std::max({1, (n_sample + kBoundsThreads - 1) / kBoundsThreads,
                               std::min((n + kBoundsThreads - 1) / kBoundsThreads,
                                        kBoundsMaxBlocks)});
  bounds_kernel<<<blocks, kBoundsThreads, 0, stream>>>(points, n, bounds, sample, n_sample,
                                                       stride);
}

float decode_bound(uint32_t w, bool is_max) { return key_float(is_max ? ~w : w); }

void launch_morton(const float* points, int n, const Grid& grid, uint64_t* keys,
                   int32_t* order, cudaStream_t stream) {
  constexpr int kThreads = 256;
  morton_kernel<<<(n + kThreads - 1) / kThreads, kThreads, 0, stream>>>(points, n, grid, keys,
                                                                          order);
}

void launch_layout(const uint64_t* sorted_keys, int n, int32_t* layout, cudaStream_t stream) {
  static_assert(kClasses + 1 <= 32, "one lane per class boundary");
  layout_kernel<<<1, 32, 0, stream>>>(sorted_keys, n, layout);
}

size_t sort_temp_bytes(int n) {
  size_t bytes = 0;
  cub::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> values(nullptr, nullptr);
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, values, n, 0, kMortonBits);
  return bytes;
}

cudaError_t sort_by_key(void* temp, size_t temp_bytes, uint64_t* keys, uint64_t* keys_alt,
                        int32_t* order, int32_t* order_alt, int n, uint64_t** keys_out,
                        int32_t** order_out, cudaStream_t stream) {
  cub::DoubleBuffer<uint64_t> k(keys, keys_alt);
  cub::DoubleBuffer<int32_t> v(order, order_alt);
  const cudaError_t err =
      cub::DeviceRadixSort::SortPairs(temp, temp_bytes, k, v, n, 0, kMortonBits, stream);
  *keys_out = k.Current();
  *order_out = v.Current();
  return err;
}

void launch_gather(const float* points, const int32_t* order, int n, const int32_t* layout,
                   int slots, float4* sorted, float4* leaf_lo, float4* leaf_hi,
                   cudaStream_t stream) {
  gather_kernel<<<(slots + kGatherThreads - 1) / kGatherThreads, kGatherThreads, 0, stream>>>(
      points, order, n, layout, slots, sorted, leaf_lo, leaf_hi);
}

void launch_level(const float4* child_lo, const float4* child_hi, int n_child, float4* lo,
                  float4* hi, int n_node, cudaStream_t stream) {
  (void)n_node;  // == ceil(n_child / kFanout), one warp each
  level_kernel<<<(n_child + kLevelThreads - 1) / kLevelThreads, kLevelThreads, 0, stream>>>(
      child_lo, child_hi, n_child, lo, hi);
}

void launch_query(const float4* sorted, const Tree& tree, int k, int budget, float* out,
                  int32_t* deferred, cudaStream_t stream) {
  dispatch_query(k, sorted, tree, budget, out, deferred, stream,
                 std::make_integer_sequence<int, kMaxK>{});
}

void launch_deferred(const float4* sorted, const Tree& tree, int k, float* out,
                     const int32_t* deferred, cudaStream_t stream) {
  dispatch_query(k, sorted, tree, -1, out, const_cast<int32_t*>(deferred), stream,
                 std::make_integer_sequence<int, kMaxK>{});
}

}  // namespace gpucheck::knn
