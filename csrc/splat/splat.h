// Tile-based 3D Gaussian splatting rasterizer, forward and backward: launcher declarations.
// No torch headers here: splat.cpp (entry points) checks the inputs, allocates everything with
// the caching allocator and calls these launchers on the current stream; each launcher
// launches exactly one kernel (or one cub algorithm), so the caller checks right after it.
// Two differentiable stages (as in gsplat): `project` (per Gaussian: screen mean, conic,
// colour, depth, radius, plus the tile binning) and `render` (per tile compositing); each has
// its backward (splat_backward.cu).
// Conventions (camera, pixel centres, culling, radius, tile rectangle, compositing) are those
// of gpucheck/kernels/splat/reference.py, which is the oracle of this kernel.
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
// The tile rectangle is the 3-sigma square of the radius intersected with the box where the
// Gaussian can still reach alpha >= 1/255 (derivation and margins: tile_box in splat_cuda.cu;
// the reference's TILE_BOX_* constants are the same numbers).
constexpr double kOpacityMin = 1.0 / 255.0;   // a smaller opacity reaches 1/255 nowhere
constexpr double kBoxSlackT = 0x1p-17;        // added to t = 2 ln(255 opacity)
constexpr double kBoxSlackQuad = 0x1p-18;     // times Sxx Syy / det, off the denominator
constexpr double kBoxSlackMean = 0x1p-22;     // times |screen mean|, added to the extents
constexpr double kBoxMaxSkew = 0x1p17;        // Sxx Syy / det above this: the square only
// Bytes per (Gaussian, tile) pair that a max_bytes budget counts: BYTES_PER_INTERSECTION of
// the reference (the original 3DGS layout: a 64-bit key and a 32-bit value, each
// double-buffered). Ours take less (binning_bytes in splat.cpp: a 16-bit or 32-bit tile key
// and a 32-bit value, each double-buffered: 12 or 16 bytes); the free-memory check counts
// what is allocated.
constexpr int64_t kBytesPerIntersection = 24;
// Largest width / height: tile ids (< 4096 * 4096) fit a 32-bit sort key.
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

// The dtype of the Gaussian parameters (means, scales, rotations, opacities, colours / SH,
// background), all one of these; the kernels read them as such and compute in float32 /
// float64. The camera (viewmat, K) and everything per Gaussian in screen space (means2d,
// conics, rgb, depths) and per pixel are float32 whatever the parameters' dtype.
enum class Scalar : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

struct PreprocessArgs {
  Scalar scalar;            // the element type behind the parameter pointers below
  const void* means;        // [n, 3]
  const void* scales;       // [n, 3]
  const void* rotations;    // [n, 4] wxyz, unnormalized
  const void* opacities;    // [n]
  const void* colors;       // [n, 3] (sh_degree < 0) or SH [n, sh_coeffs, 3]
  const float* viewmat;     // [4, 4] world -> camera, row-major
  const float* intrinsics;  // [3, 3]
  const void* background;   // [3]
  int n;
  int sh_degree;            // -1: colors are RGB
  int sh_coeffs;            // coefficients per channel stored in `colors` (SH only)
  int width;
  int height;
  int tiles_x;
  int tiles_y;
  // outputs, [n] each
  int32_t* radii;           // pixel radius, 0 when culled
  int64_t* counts;          // tiles touched (0 for a visible Gaussian that reaches no tile)
  int4* rects;              // tile rectangle x0, y0, x1, y1 (exclusive); 0 0 0 0 when empty
  float2* means2d;          // pixel-space mean (z replaced by 1 behind the near plane)
  float* conics;            // [n, 3] inverse 2D covariance (a, b, c); 0 when culled
  float* rgb;               // [n, 3] colour (SH evaluated, or as given)
  float* depths;            // camera depth z
  int32_t* bad;             // [kBadCount] first invalid row per BadInput (atomicMin)
  // bfloat16 / float16 parameters only (nullptr for float32, where render reads the
  // parameters themselves): float32 copies of the opacities [n] and the background [3] for
  // render, written while they are read anyway
  float* opacities_f32;
  float* background_f32;
};

// Per Gaussian: validation, projection, radius, tile rectangle, colour (in float64).
void launch_preprocess(const PreprocessArgs& args, cudaStream_t stream);

// Binning (splat_cuda.cu), in the order splat.cpp runs it:
// 1. the visible Gaussians' order by depth: a stable radix sort of the float bits of `depths`
//    (> 0 in front of the near plane, so their bits sort like the floats; the culled rows,
//    which touch no tile, may land anywhere) with the indices 0..n-1 as values, so that equal
//    depths keep index order. `order` receives the sorted indices, `depth_keys` the sorted
//    keys (unused after).
size_t depth_sort_temp_bytes(int n);
cudaError_t depth_sort(void* temp, size_t temp_bytes, const float* depths, uint32_t* depth_keys,
                       int32_t* iota, int32_t* order, int n, cudaStream_t stream);

// 2. sorted_counts[k] = counts[order[k]].
void launch_gather_counts(const int64_t* counts, const int32_t* order, int n,
                          int64_t* sorted_counts, cudaStream_t stream);

// Scratch bytes for inclusive_scan over n items.
size_t scan_temp_bytes(int n);

// 3. offsets[k] = counts[0] + ... + counts[k] (int64: a bad scene can touch > 2^31 tiles).
cudaError_t inclusive_scan(void* temp, size_t temp_bytes, const int64_t* counts,
                           int64_t* offsets, int n, cudaStream_t stream);

// 4. One (tile id, Gaussian index) pair per Gaussian-tile overlap, Gaussian by Gaussian in
// depth order (`order`; offsets: the inclusive scan of the counts in that order), so that a
// stable sort on the tile id alone leaves each tile's Gaussians front to back, equal depths in
// index order. Key: uint16_t when the tiles number <= 65536 (every image up to 4096x4096),
// else uint32_t.
template <typename Key>
void launch_emit(const int64_t* counts, const int32_t* order, const int64_t* offsets,
                 const int4* rects, int n, int tiles_x, Key* keys, int32_t* values,
                 cudaStream_t stream);

// Scratch bytes for sort_pairs with `items` pairs.
template <typename Key>
size_t sort_temp_bytes(int items, int end_bit);

// 5. Stable radix sort of (keys, values) on bits [0, end_bit); the sorted pairs end in
// *keys_out / *values_out (each either the first or the alternate buffer).
template <typename Key>
cudaError_t sort_pairs(void* temp, size_t temp_bytes, Key* keys, Key* keys_alt, int32_t* values,
                       int32_t* values_alt, int items, int end_bit, Key** keys_out,
                       int32_t** values_out, cudaStream_t stream);

// 6. ranges[t] = [first, last) sorted positions of tile t; zeroed by the caller.
template <typename Key>
void launch_ranges(const Key* sorted_keys, int items, int2* ranges, cudaStream_t stream);

// Per-Gaussian compositing inputs (what `project` returned), shared by render and backward.
struct SplatInputs {
  const int2* ranges;       // [tiles] sorted positions [first, last) of each tile
  const int32_t* ids;       // [overlaps] Gaussian of each sorted position
  const float2* means2d;    // [n]
  const float* conics;      // [n, 3]
  const float* opacities;   // [n]
  const float* rgb;         // [n, 3]
  const float* depths;      // [n]
  const float* background;  // [3]
  int width;
  int height;
  int tiles_x;
  int tiles_y;
};

// One 16x16 block per tile: front-to-back compositing of the tile's Gaussians.
// image [3, height, width], alpha, depth, final_T [height, width] float; n_contrib
// [height, width] int32: 1 + the position (within its tile's list) of the last Gaussian the
// pixel composited, 0 if none (what the backward pass walks back from).
void launch_render(const SplatInputs& in, float* image, float* alpha, float* depth,
                   float* final_T, int32_t* n_contrib, cudaStream_t stream);

// Backward of render: per tile, back to front, d loss / d (means2d, conics, opacities, rgb,
// depths), summed over each warp and then over the block, and accumulated with one atomicAdd
// per Gaussian, tile and value (the outputs must be zeroed first). grad_* are d loss / d (image, alpha, depth) of the forward.
struct RenderGrads {
  const float* alpha;       // [h, w] forward output (the sum of the weights)
  const float* depth;       // [h, w] forward output
  const float* final_T;     // [h, w]
  const int32_t* n_contrib; // [h, w]
  const float* grad_image;  // [3, h, w]
  const float* grad_alpha;  // [h, w], or nullptr: zero
  const float* grad_depth;  // [h, w], or nullptr: zero
  float2* g_means2d;        // [n] outputs from here on
  float* g_conics;          // [n, 3]
  float* g_opacities;       // [n]
  float* g_rgb;             // [n, 3]
  float* g_depths;          // [n]
};
// pixels_per_thread: 2 or 4 (kBackwardPixels; GPUCHECK_SPLAT_BACKWARD_PIXELS overrides it, for
// tuning and tests), the pixels of one column each thread walks.
constexpr int kBackwardPixels = 4;
void launch_render_backward(const SplatInputs& in, const RenderGrads& g, int pixels_per_thread,
                            cudaStream_t stream);

// Backward of project (per Gaussian; float32, decisions in float64): from d loss / d (means2d,
// conics, rgb, depths) to d loss / d (means, scales, rotations, colours or SH), written in the
// parameters' dtype (computed in float32, rounded once at the store).
struct ProjectGrads {
  Scalar scalar;            // the element type of the parameters and their gradients
  const void* means;        // [n, 3]
  const void* scales;       // [n, 3]
  const void* rotations;    // [n, 4]
  const void* colors;       // [n, 3] or SH [n, sh_coeffs, 3]
  const float* viewmat;     // [4, 4]
  const float* intrinsics;  // [3, 3]
  const int32_t* radii;     // [n]
  const float* g_means2d;   // [n, 2]
  const float* g_conics;    // [n, 3]
  const float* g_rgb;       // [n, 3]
  const float* g_depths;    // [n]
  int n;
  int sh_degree;
  int sh_coeffs;
  int width;
  int height;
  void* g_means;            // [n, 3] outputs
  void* g_scales;           // [n, 3]
  void* g_rotations;        // [n, 4]
  void* g_colors;           // like colors (every element written)
  // bfloat16 / float16 only (else nullptr): the float32 gradients of render's float32 copies
  // of the opacities [n] and the background [3] (render backward's, summed with atomics),
  // rounded into the parameters' dtype
  const float* g_opacities_f32;
  const float* g_background_f32;
  void* g_opacities;        // [n]
  void* g_background;       // [3]
};
void launch_project_backward(const ProjectGrads& g, cudaStream_t stream);

}  // namespace gpucheck::splat
