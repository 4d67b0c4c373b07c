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
constexpr int kMortonBits = 63; // 21 bits per axis

// Layout of the 7 uint32 words written by launch_bounds (all initialised to 0xFFFFFFFF):
// [0..2] order-preserving key of the min x/y/z, [3..5] complement of the key of the max x/y/z,
// [6] smallest row index holding a NaN or inf (0xFFFFFFFF: none).
constexpr int kBoundsWords = 7;

// Bounding box + first non-finite row of points [n, 3].
void launch_bounds(const float* points, int n, uint32_t* bounds, cudaStream_t stream);

// Decodes word `w` of the bounds buffer (copied to the host) back into a float.
float decode_bound(uint32_t w, bool is_max);

// keys[i] = Morton code of points[i] quantised on a cubic grid (origin, scale); order[i] = i.
void launch_morton(const float* points, int n, float3 origin, float scale, uint64_t* keys,
                   int32_t* order, cudaStream_t stream);

// Scratch bytes for sort_by_key with n items.
size_t sort_temp_bytes(int n);

// Stable radix sort of (keys, order) pairs; the sorted order ends in *order_out, which is
// either order or order_alt. Returns cub's status.
cudaError_t sort_by_key(void* temp, size_t temp_bytes, uint64_t* keys, uint64_t* keys_alt,
                        int32_t* order, int32_t* order_alt, int n, int32_t** order_out,
                        cudaStream_t stream);

// sorted[i] = (points[order[i]], bit pattern of order[i]); leaf boxes of 32 sorted points.
void launch_gather(const float* points, const int32_t* order, int n, float4* sorted,
                   float4* leaf_lo, float4* leaf_hi, cudaStream_t stream);

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

// out[order[i]] = mean squared distance of sorted point i to its k nearest other points.
void launch_query(const float4* sorted, int n, const Tree& tree, int k, float* out,
                  cudaStream_t stream);

}  // namespace gpucheck::knn
