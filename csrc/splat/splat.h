// Tile-based 3D Gaussian splatting rasterizer, forward pass: launcher declarations.
// No torch headers here: splat.cpp (entry point) checks the inputs, allocates everything with
// the caching allocator and calls these launchers on the current stream; each launcher
// launches exactly one kernel (or one cub algorithm), so the caller checks right after it.
// Conventions (camera, pixel centres, culling, radius, tile rectangle, compositing) are those
// of gpucheck/reference/splat.py, which is the oracle of this kernel.
#pragma once

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>

namespace gpucheck::splat {

constexpr int kTileSize = 16;              // tiles are kTileSize x kTileSize pixels
constexpr int kBlockPixels = kTileSize * kTileSize;
constexpr double kNearPlane = 0.2;         // camera depth z <= kNearPlane is culled
constexpr double kLowPass = 0.3;           // added to the 2D covariance's diagonal (pixels^2)
constexpr float kAlphaMin = 1.0f / 255.0f; // Gaussians with a smaller alpha are skipped
constexpr float kAlphaMax = 0.99f;         // alpha is clamped to this
constexpr float kTransmittanceMin = 1e-4f; // a pixel stops before T would fall below this
constexpr int kMaxShDegree = 3;
// Bytes per (Gaussian, tile) pair of the binning buffers: a 64-bit key and a 32-bit value,
// each double-buffered for the radix sort (BYTES_PER_INTERSECTION of the reference).
constexpr int64_t kBytesPerIntersection = 24;
// Largest width / height: tile ids (< 4096 * 4096) fit the 32 high bits of a sort key.
constexpr int64_t kMaxImageSide = 65536;

// Rows of the first invalid input of each kind (kNone: none), found while preprocessing.
enum BadInput : int {
  kBadNonFinite = 0,  // a NaN/inf in means, scales, rotations, opacities or colours/SH
  kBadScale = 1,      // a scale <= 0
  kBadOpacity = 2,    // an opacity outside [0, 1]
  kBadRotation = 3,   // an all-zero quaternion
  kBadCamera = 4,     // row 0 when viewmat / K / background are malformed or not finite
  kBadCount = 5,
};
constexpr int32_t kNone = 0x7F7F7F7F;  // what cudaMemset(0x7F) writes; larger than any row

struct PreprocessArgs {
  const float* means;       // [n, 3]
  const float* scales;      // [n, 3]
  const float* rotations;   // [n, 4] wxyz, unnormalized
  const float* opacities;   // [n]
  const float* colors;      // [n, 3] (sh_degree < 0) or SH [n, sh_coeffs, 3]
  const float* viewmat;     // [4, 4] world -> camera, row-major
  const float* intrinsics;  // [3, 3]
  const float* background;  // [3]
  int n;
  int sh_degree;            // -1: colors are RGB
  int sh_coeffs;            // coefficients per channel stored in `colors` (SH only)
  int width;
  int height;
  int tiles_x;
  int tiles_y;
  // outputs, [n] each
  int32_t* radii;           // pixel radius, 0 when culled
  int64_t* counts;          // tiles touched
  int4* rects;              // tile rectangle x0, y0, x1, y1 (exclusive)
  float2* xy;               // pixel-space mean
  float4* conic_opacity;    // inverse 2D covariance (a, b, c) and opacity
  float4* color_depth;      // RGB and camera depth
  int32_t* bad;             // [kBadCount] first invalid row per BadInput (atomicMin)
};

// Per Gaussian: validation, projection, radius, tile rectangle, colour (in float64).
void launch_preprocess(const PreprocessArgs& args, cudaStream_t stream);

// Scratch bytes for inclusive_scan over n items.
size_t scan_temp_bytes(int n);

// offsets[i] = counts[0] + ... + counts[i] (int64: a bad scene can touch > 2^31 tiles).
cudaError_t inclusive_scan(void* temp, size_t temp_bytes, const int64_t* counts,
                           int64_t* offsets, int n, cudaStream_t stream);

// One (tile << 32 | depth bits, Gaussian index) pair per Gaussian-tile overlap, Gaussian by
// Gaussian in index order (so that the stable sort keeps index order for equal depths).
void launch_emit(const int64_t* counts, const int64_t* offsets, const int4* rects,
                 const float4* color_depth, int n, int tiles_x, uint64_t* keys,
                 int32_t* values, cudaStream_t stream);

// Scratch bytes for sort_pairs with `items` pairs.
size_t sort_temp_bytes(int items, int end_bit);

// Stable radix sort of (keys, values) on bits [0, end_bit); the sorted pairs end in
// *keys_out / *values_out (each either the first or the alternate buffer).
cudaError_t sort_pairs(void* temp, size_t temp_bytes, uint64_t* keys, uint64_t* keys_alt,
                       int32_t* values, int32_t* values_alt, int items, int end_bit,
                       uint64_t** keys_out, int32_t** values_out, cudaStream_t stream);

// ranges[t] = [first, last) sorted positions of tile t; zeroed by the caller.
void launch_ranges(const uint64_t* sorted_keys, int items, int2* ranges, cudaStream_t stream);

// One 16x16 block per tile: front-to-back compositing of the tile's Gaussians.
// image [3, height, width], alpha [height, width], depth [height, width].
void launch_render(const int2* ranges, const int32_t* sorted_values, const float2* xy,
                   const float4* conic_opacity, const float4* color_depth,
                   const float* background, int width, int height, int tiles_x, int tiles_y,
                   float* image, float* alpha, float* depth, cudaStream_t stream);

}  // namespace gpucheck::splat
