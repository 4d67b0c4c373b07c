// gpucheck's self-test zoo: a tile-based Gaussian rasterizer in the shape of the 3DGS one
// (diff-gaussian-rasterization): geometry / binning / image state carved out of opaque byte
// buffers that the caller grows through resize functions, cub scan and radix sort, per-tile
// front-to-back blending. The Gaussians come projected (means2D, isotropic sigmas in pixels).
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
};

// Forward: returns the number of (Gaussian, tile) pairs rendered; fills out_color [3, H, W]
// and radii [P]. The three resize functions grow the caller's byte buffers and return them.
int rasterize_forward(const RasterArgs& a, std::function<char*(size_t)> geometry_buffer,
                      std::function<char*(size_t)> binning_buffer,
                      std::function<char*(size_t)> image_buffer, float* out_color, int* radii,
                      cudaStream_t stream);

// Backward: dL/d(colors) [P, 3] (or dL/d(sh_dc) when sh_dc is given), into dL_dcolor, from
// the state the forward left in the three buffers.
void rasterize_backward(const RasterArgs& a, int num_rendered, char* geometry_buffer,
                        char* binning_buffer, char* image_buffer, const float* dL_dout_color,
                        float* dL_dcolor, cudaStream_t stream);

}  // namespace TORCH_EXTENSION_NAME
