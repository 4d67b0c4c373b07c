// Exact k-nearest-neighbour mean squared distance (issue 4): launcher declarations.
// No torch headers here: knn.cpp (entry point) allocates everything with the caching allocator
// and calls these launchers on the current stream; each launcher launches exactly one kernel
// (or one cub sort), so the caller checks the launch right after each call.
#pragma once

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>

namespace gpucheck::knn {

constexpr int kMaxK = 16;       // largest supported k (top-k lives in registers)
constexpr int kLeafSize = 32;   // points per leaf = one warp of queries
constexpr int kFanout = 32;     // children per inner node = one warp of boxes
constexpr int kMaxLevels = 8;   // N < 2^31: 2^26 leaves -> 2^21 -> ... -> 2 -> 1 (7 levels)
constexpr int kMortonBits = 63; // sort key bits: 3 x 21 (one class) or 3 (class) + 3 x 20
constexpr int kClasses = 8;     // nested cubes of the split grid (class 0: the dense core)
// Largest N: the padded slots (N + 32 * kClasses at most) must fit an int.
constexpr int64_t kMaxPoints = 2147483647 - 32 * kClasses;
// Default walk budget of a query warp (loop steps) before it defers its queries to one warp
// each; GPUCHECK_KNN_WALK_BUDGET overrides it (0: every query is deferred, for tests).
constexpr int kWalkBudget = 1024;

// Points sampled (strided) for the robust box of the split grid.
constexpr int kSampleSize = 1024;

// Layout of the 7 uint32 words written by launch_bounds (all initialised to 0xFFFFFFFF):
// [0..2] order-preserving key of the min x/y/z, [3..5] complement of the key of the max x/y/z,
// [6] smallest row index holding a NaN or inf (0xFFFFFFFF: none).
constexpr int kBoundsWords = 7;

// Bounding box + first non-finite row of points [n, 3]; also copies rows 0, stride, 2 stride,
// ... (n_sample rows, n_sample <= n) to sample [n_sample, 3] for the robust box.
void launch_bounds(const float* points, int n, uint32_t* bounds, float* sample, int n_sample,
                   int stride, cudaStream_t stream);

// Decodes word `w` of the bounds buffer (copied to the host) back into a float.
float decode_bound(uint32_t w, bool is_max);

// Where the sort keys come from. classes == 1: one cubic grid of 2^21 cells per axis over the
// bounding box (origin[0], scale[0]). classes == kClasses (a cloud with far outliers): point p
// belongs to the smallest class c whose cube |p - center|_inf <= h0 * f^c holds it (the last
// cube holds everything), and its key is c followed by its Morton code on a 2^20 grid over
// that cube (origin[c], scale[c]): the dense core keeps its resolution however far the
// outliers are, and each class is sorted apart from the others.
struct Grid {
  float3 origin[kClasses];
  float scale[kClasses];
  float3 center;
  float h0;          // half-width of class 0's cube
  float inv_log2_f;  // 1 / log2(f)
  int classes;       // 1 or kClasses
};

// keys[i] = class and Morton code of points[i] on `grid`; order[i] = i.
void launch_morton(const float* points, int n, const Grid& grid, uint64_t* keys,
                   int32_t* order, cudaStream_t stream);

// Words of the layout buffer written by launch_layout.
constexpr int kLayoutWords = 2 * (kClasses + 1);

// From the sorted keys (split grid only): layout[c] = first sorted position of class c
// (layout[kClasses] = n), layout[kClasses + 1 + c] = first slot of class c in the padded
// order, where every class starts a new leaf.
void launch_layout(const uint64_t* sorted_keys, int n, int32_t* layout, cudaStream_t stream);

// Slots of the padded order: enough for any class counts (each class wastes < one leaf).
inline int64_t padded_slots(int64_t n, int classes) {
  return (n + kLeafSize - 1) / kLeafSize * kLeafSize + int64_t{kLeafSize} * (classes - 1);
}

// Scratch bytes for sort_by_key with n items.
size_t sort_temp_bytes(int n);

// Stable radix sort of (keys, order) pairs; the sorted keys and order end in *keys_out and
// *order_out (each either the first or the alternate buffer). Returns cub's status.
cudaError_t sort_by_key(void* temp, size_t temp_bytes, uint64_t* keys, uint64_t* keys_alt,
                        int32_t* order, int32_t* order_alt, int n, uint64_t** keys_out,
                        int32_t** order_out, cudaStream_t stream);

// sorted[s] = (points[order[i]], bit pattern of order[i]) for the sorted point i of slot s;
// empty slots (the padding at the end of a class, or past the end) hold (+inf, +inf, +inf, -1).
// Leaf boxes of 32 slots (an empty leaf gets lo = +inf, hi = -inf). layout == nullptr: slot
// s holds sorted point s (one class).
void launch_gather(const float* points, const int32_t* order, int n, const int32_t* layout,
                   int slots, float4* sorted, float4* leaf_lo, float4* leaf_hi,
                   cudaStream_t stream);

// Boxes of one inner level: node j bounds children [32 j, 32 j + 32) of the level below.
void launch_level(const float4* child_lo, const float4* child_hi, int n_child, float4* lo,
                  float4* hi, int n_node, cudaStream_t stream);

// The implicit 32-ary box tree over the sorted points. Level 0 holds the leaves; level `top`
// holds the single root (top == 0 when there is only one leaf).
struct Tree {
  const float4* lo[kMaxLevels];
  const float4* hi[kMaxLevels];
  int count[kMaxLevels];
  int top;
};

// out[index] = mean squared distance of each point in `sorted` (tree.count[0] * 32 slots) to
// its k nearest other points. A warp whose walk takes more than `budget` steps (0 <= budget)
// writes nothing and appends its points' slots to `deferred` ([1 + tree.count[0] * 32] int32:
// [0] the count, zeroed by the caller, then the slots).
void launch_query(const float4* sorted, const Tree& tree, int k, int budget, float* out,
                  int32_t* deferred, cudaStream_t stream);

// The deferred queries: one warp per query, its own point as the query box, no budget.
void launch_deferred(const float4* sorted, const Tree& tree, int k, float* out,
                     const int32_t* deferred, cudaStream_t stream);

}  // namespace gpucheck::knn
