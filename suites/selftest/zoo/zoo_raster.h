// gpucheck's self-test zoo: a tile-based Gaussian rasterizer in the shape of the 3DGS one
// (diff-gaussian-rasterization): geometry / binning / image state carved out of opaque byte
// buffers that the caller grows through resize functions, cub scan and radix sort, per-tile
// front-to-back blending, tiles a mask leaves out (gsplat's tile masks). The Gaussians come
// projected (means2D, isotropic sigmas in pixels), by the caller or by a projection in the
// shape of gsplat's: culled Gaussians get radius 0 and nothing else written.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace TORCH_EXTENSION_NAME {

constexpr int kTile = 16;
//: a Gaussian nearer than this is culled (radius 0)
constexpr float kNear = 0.2f;

struct RasterArgs {
  int P, width, height;
  const float* background;  // [3]
  const float* means2D;     // [P, 2] pixels
  const float* depths;      // [P]
  const float* sigmas;      // [P] pixels
  const float* opacities;   // [P, 1]
  const float* colors;      // [P, 3] or nullptr: sh_dc
  const float* sh_dc;       // [P, 3] or nullptr: colors
  const bool* tile_mask;    // [tiles_y, tiles_x] or nullptr: every tile rendered
};

// Forward: returns the number of (Gaussian, tile) pairs rendered; fills out_color [3, H, W]
// (the background in the tiles the mask leaves out), out_alpha [H, W] (1 - transmittance),
// out_last [H, W] (the sorted list's index of each pixel's last contributor, -1: none) and
// radii [P]. The three resize functions grow the caller's byte buffers and return them.
int rasterize_forward(const RasterArgs& a, std::function<char*(size_t)> geometry_buffer,
                      std::function<char*(size_t)> binning_buffer,
                      std::function<char*(size_t)> image_buffer, float* out_color,
                      float* out_alpha, int* out_last, int* radii, cudaStream_t stream);

struct ProjectArgs {
  int P, width, height;
  float focal;              // pixels; a pinhole camera at the origin looking along +z
  const float* means3D;     // [P, 3]
  const float* log_scales;  // [P, 3]
};

// Projection: radii [P] for every Gaussian (0: culled, behind kNear or off the image); the
// means2D [P, 2], depths [P], conics [P, 3] (inverse 2D covariance, upper triangle) of the
// others only: a culled Gaussian's entries are never written (the caller tests radii).
void project_forward(const ProjectArgs& a, float* means2D, float* depths, float* conics,
                     int* radii, cudaStream_t stream);

// Backward: dL/d(colors) [P, 3] (or dL/d(sh_dc) when sh_dc is given), into dL_dcolor, from
// the state the forward left in the three buffers.
void rasterize_backward(const RasterArgs& a, int num_rendered, char* geometry_buffer,
                        char* binning_buffer, char* image_buffer, const float* dL_dout_color,
                        float* dL_dcolor, cudaStream_t stream);

}  // namespace TORCH_EXTENSION_NAME
