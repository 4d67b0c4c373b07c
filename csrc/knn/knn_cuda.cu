// Exact k-nearest-neighbour mean squared distance: kernels and launchers (issue 4).
//
// Algorithm (all on the GPU, O(N log N) work for the build, about O(N) for the queries):
//  1. bounds: bounding box of the cloud and the first non-finite row (host checks it).
//  2. morton: 63-bit Morton code of each point on a cubic 2^21 grid over the box; cub radix
//     sort of (code, index) pairs. 21 bits per axis keep tight clusters apart in the order.
//  3. gather: points in Morton order as float4 (x, y, z, original index bits); every 32
//     consecutive sorted points form a leaf with its bounding box.
//  4. levels: an implicit 32-ary tree over the leaves (node j of level l bounds nodes
//     [32 j, 32 j + 32) of level l - 1) up to a single root.
//  5. query: one warp per leaf, one lane per query point, so a warp's 32 queries are close in
//     space and the warp walks the tree together: first the top-k of each lane is seeded with
//     the other points of its own leaf; then a depth-first walk visits children nearest first
//     (lower bound: distance between the child box and the box of the warp's queries) and
//     stops a level as soon as the nearest remaining child is farther than the largest
//     current k-th distance in the warp. At the leaves each lane tests the leaf box against
//     its own k-th distance and the warp scans the leaf (32 points staged in shared memory)
//     when any lane needs it.
//
// Exactness: every distance is computed from coordinate differences of the input floats with
// the same fixed sequence of round-to-nearest operations (sub, mul, fma, fma), and every box
// bound uses that same sequence on per-axis gaps that are never larger than the point's, so
// a pruned box cannot hold a point that would enter the top-k (rounding is monotonic). The
// result is the exact k smallest of the float32 distances, averaged in float32.
#include "knn/knn.h"

#include <cub/cub.cuh>
#include <cuda/std/limits>

#include <algorithm>
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
    bounds_kernel(const float* __restrict__ points, int n, uint32_t* __restrict__ bounds) {
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

__device__ __forceinline__ uint32_t quantise(float c, float origin, float scale) {
  constexpr float kMaxCell = 2097151.0f;  // 2^21 - 1
  return static_cast<uint32_t>(fminf(fmaxf(__fsub_rn(c, origin) * scale, 0.0f), kMaxCell));
}

__global__ void morton_kernel(const float* __restrict__ points, int n, float3 origin,
                              float scale, uint64_t* __restrict__ keys,
                              int32_t* __restrict__ order) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* r = points + 3 * static_cast<int64_t>(i);
  const uint32_t x = quantise(r[0], origin.x, scale);
  const uint32_t y = quantise(r[1], origin.y, scale);
  const uint32_t z = quantise(r[2], origin.z, scale);
  keys[i] = (spread3(x) << 2) | (spread3(y) << 1) | spread3(z);
  order[i] = i;
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
                  float4* __restrict__ sorted, float4* __restrict__ leaf_lo,
                  float4* __restrict__ leaf_hi) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // blockDim % 32 == 0: warp == leaf
  if (i - (threadIdx.x & 31) >= n) return;              // whole warp past the end
  float4 lo = make_float4(kInf, kInf, kInf, 0.0f);
  float4 hi = make_float4(-kInf, -kInf, -kInf, 0.0f);
  if (i < n) {
    const int o = order[i];
    const float* r = points + 3 * static_cast<int64_t>(o);
    const float4 p = make_float4(r[0], r[1], r[2], __int_as_float(o));
    sorted[i] = p;
    lo = p;
    hi = p;
  }
  warp_box(lo, hi, leaf_lo, leaf_hi, i / kLeafSize);
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

template <int K>
__global__ void __launch_bounds__(kQueryThreads)
    query_kernel(const float4* __restrict__ pts, int n, const Tree tree, float* __restrict__ out) {
  const float4 kFar = make_float4(kInf, kInf, kInf, 0.0f);
  __shared__ float4 s_pts[kQueryWarps][kLeafSize];
  __shared__ uint32_t s_keys[kQueryWarps][kMaxLevels][32];

  const int lane = threadIdx.x & 31;
  const int wib = threadIdx.x >> 5;
  const int leaf = blockIdx.x * kQueryWarps + wib;
  if (leaf >= tree.count[0]) return;  // warp-uniform
  float4* stage = s_pts[wib];
  const int i = leaf * kLeafSize + lane;
  const bool valid = i < n;
  const float4 q = pts[valid ? i : n - 1];  // idle lanes copy a point of this leaf

  // Seed window: the 32 sorted points around the own leaf (the last 32 points for a partial
  // last leaf), so that every lane starts with k candidates (N > k guarantees enough).
  const int ws = max(0, min(leaf * kLeafSize, n - kLeafSize));
  const int we = min(ws + kLeafSize, n);
  stage[lane] = (ws + lane < we) ? pts[ws + lane] : kFar;
  __syncwarp();
  float best[K];
#pragma unroll
  for (int j = 0; j < K; ++j) best[j] = kInf;
  scan<K>(stage, q, i - ws, best);
  if (!valid) {
#pragma unroll
    for (int j = 0; j < K; ++j) best[j] = 0.0f;  // idle lanes never vote, never widen r2
  }

  if (tree.top > 0) {
    // Box of the warp's queries; r2 = largest current k-th distance in the warp (valid lanes).
    const float4 qlo = make_float4(warp_min(q.x), warp_min(q.y), warp_min(q.z), 0.0f);
    const float4 qhi = make_float4(warp_max(q.x), warp_max(q.y), warp_max(q.z), 0.0f);
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
    while (true) {
      const uint32_t kmin = __reduce_min_sync(kFullMask, key);
      // Keys are lower bounds sorted by the min-reduction: once the nearest remaining child is
      // not closer than r2 (which only shrinks), none of the others at this level is either.
      if (kmin == kNoKey || !(__uint_as_float(kmin & ~31u) < r2)) {
        if (level == tree.top) break;
        ++level;
        node /= kFanout;
        key = s_keys[wib][level][lane];
        continue;
      }
      const int c = static_cast<int>(kmin & 31u);
      if (lane == c) key = kNoKey;
      const int child = node * kFanout + c;
      if (level > 1) {  // descend into an inner node
        s_keys[wib][level][lane] = key;
        --level;
        node = child;
        key = load_children();
        continue;
      }
      if (child == leaf) continue;  // the seed window already holds the own leaf
      const float4 blo = shfl4(clo, c);
      const float4 bhi = shfl4(chi, c);
      const bool need = valid && box_dist(q, blo, bhi) < best[K - 1];
      if (!__any_sync(kFullMask, need)) continue;
      const int g = child * kLeafSize + lane;
      __syncwarp();
      stage[lane] = (g < n && (g < ws || g >= we)) ? pts[g] : kFar;  // skip seed-window points
      __syncwarp();
      scan<K>(stage, q, -1, best);
      r2 = __uint_as_float(__reduce_max_sync(kFullMask, __float_as_uint(best[K - 1])));
    }
  }

  if (valid) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < K; ++j) sum = __fadd_rn(sum, best[j]);
    out[__float_as_int(q.w)] = __fdiv_rn(sum, static_cast<float>(K));
  }
}

template <int K>
void launch_query_k(const float4* sorted, int n, const Tree& tree, float* out,
                    cudaStream_t stream) {
  const int blocks = (tree.count[0] + kQueryWarps - 1) / kQueryWarps;
  query_kernel<K><<<blocks, kQueryThreads, 0, stream>>>(sorted, n, tree, out);
}

template <int... Ks>
void dispatch_query(int k, const float4* sorted, int n, const Tree& tree, float* out,
                    cudaStream_t stream, std::integer_sequence<int, Ks...>) {
  // k is validated by the caller (1 <= k <= kMaxK); exactly one branch runs.
  ((k == Ks + 1 ? launch_query_k<Ks + 1>(sorted, n, tree, out, stream) : void()), ...);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// launchers
// ---------------------------------------------------------------------------------------------
void launch_bounds(const float* points, int n, uint32_t* bounds, cudaStream_t stream) {
  const int blocks = std::max(1, std::min((n + kBoundsThreads - 1) / kBoundsThreads,
                                          kBoundsMaxBlocks));
  bounds_kernel<<<blocks, kBoundsThreads, 0, stream>>>(points, n, bounds);
}

float decode_bound(uint32_t w, bool is_max) { return key_float(is_max ? ~w : w); }

void launch_morton(const float* points, int n, float3 origin, float scale, uint64_t* keys,
                   int32_t* order, cudaStream_t stream) {
  constexpr int kThreads = 256;
  morton_kernel<<<(n + kThreads - 1) / kThreads, kThreads, 0, stream>>>(points, n, origin,
                                                                          scale, keys, order);
}

size_t sort_temp_bytes(int n) {
  size_t bytes = 0;
  cub::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> values(nullptr, nullptr);
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, values, n, 0, kMortonBits);
  return bytes;
}

cudaError_t sort_by_key(void* temp, size_t temp_bytes, uint64_t* keys, uint64_t* keys_alt,
                        int32_t* order, int32_t* order_alt, int n, int32_t** order_out,
                        cudaStream_t stream) {
  cub::DoubleBuffer<uint64_t> k(keys, keys_alt);
  cub::DoubleBuffer<int32_t> v(order, order_alt);
  const cudaError_t err =
      cub::DeviceRadixSort::SortPairs(temp, temp_bytes, k, v, n, 0, kMortonBits, stream);
  *order_out = v.Current();
  return err;
}

void launch_gather(const float* points, const int32_t* order, int n, float4* sorted,
                   float4* leaf_lo, float4* leaf_hi, cudaStream_t stream) {
  gather_kernel<<<(n + kGatherThreads - 1) / kGatherThreads, kGatherThreads, 0, stream>>>(
      points, order, n, sorted, leaf_lo, leaf_hi);
}

void launch_level(const float4* child_lo, const float4* child_hi, int n_child, float4* lo,
                  float4* hi, int n_node, cudaStream_t stream) {
  (void)n_node;  // == ceil(n_child / kFanout), one warp each
  level_kernel<<<(n_child + kLevelThreads - 1) / kLevelThreads, kLevelThreads, 0, stream>>>(
      child_lo, child_hi, n_child, lo, hi);
}

void launch_query(const float4* sorted, int n, const Tree& tree, int k, float* out,
                  cudaStream_t stream) {
  dispatch_query(k, sorted, n, tree, out, stream,
                 std::make_integer_sequence<int, kMaxK>{});
}

}  // namespace gpucheck::knn
