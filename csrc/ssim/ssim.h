// Fused SSIM (11x11 Gaussian window, sigma 1.5, C1 = 0.01^2, C2 = 0.03^2): launcher
// declarations shared by the entry points (ssim.cpp) and the kernels (ssim_cuda.cu: forward,
// ssim_backward.cu: backward).
// No torch headers here: the .cu files stay free of them.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace gpucheck::ssim {

// Element type of the images; float16/bfloat16/float32 accumulate in float32, float64 in
// float64. The pointers below are typed by it (c10::Half/BFloat16 share __half/__nv_bfloat16's
// layout).
enum class Dtype { kFloat32, kFloat16, kBFloat16, kFloat64 };

// Shape of one call: `planes` = B * C images of height x width. With `valid`, the map is
// (height - 10) x (width - 10) and its pixel (i, j) is centred on image pixel (i + 5, j + 5);
// otherwise the map is height x width (zero padding).
struct Geometry {
  int64_t planes;
  int height;
  int width;
  bool valid;

  int offset() const { return valid ? 5 : 0; }
  int out_height() const { return valid ? height - 10 : height; }
  int out_width() const { return valid ? width - 10 : width; }
};

// Thread blocks of the forward kernel (`mean`: reduction = mean).
int64_t forward_blocks(Dtype dtype, const Geometry& geo, bool mean);
// Thread blocks of the backward kernel.
int64_t backward_blocks(const Geometry& geo);
// Cells of the mean (ssim_device.cuh): the partial sums that either kernel writes with
// reduction = mean, [planes, ceil((height + 5) / 16), ceil((width + 5) / 116)].
int64_t mean_cells(const Geometry& geo);

// Forward pass in one kernel. Exactly one of `map` (dtype, [planes, out_h, out_w]) and
// `partials` (float32, or float64 for kFloat64; [mean_cells]) is non-null: the SSIM map, or
// the sum of the map over each cell (reduction = mean). Returns the error of setting the
// kernel's shared-memory attribute (the launch itself is checked by the caller).
cudaError_t launch_forward(Dtype dtype, const void* img1, const void* img2, const Geometry& geo,
                           void* map, void* partials, cudaStream_t stream);

// Second stage of reduction = mean: out[0] = (sum of partials[0..count)) * scale, summed in
// float64 in a fixed order (bitwise reproducible). `out` has `dtype`, `partials` as above.
cudaError_t launch_mean(Dtype dtype, const void* partials, int64_t count, double scale,
                        void* out, cudaStream_t stream);

// Backward pass in one kernel, recomputing the moments from the images (nothing is saved by
// the forward). `grad` has `dtype`: one element when `grad_is_scalar` (reduction = mean; the
// per-pixel gradient is grad[0] * scale, or `scale` when grad is null), else
// [planes, out_h, out_w]. Writes grad1 ([planes, height, width], dtype) and, when non-null,
// grad2 and `partials` ([mean_cells], as launch_forward's: the same values, bit for bit, so
// that launch_mean gives the forward's mean; the training step's forward needs no forward
// kernel).
cudaError_t launch_backward(Dtype dtype, const void* grad, bool grad_is_scalar, double scale,
                            const void* img1, const void* img2, const Geometry& geo, void* grad1,
                            void* grad2, void* partials, cudaStream_t stream);

// In place: grad[0..n) *= upstream[0] * factor (`grad` and the one-element `upstream` have
// `dtype`), computed in the accumulator type with one rounding for 16-bit types when `factor`
// is a power of two.
cudaError_t launch_scale(Dtype dtype, void* grad, int64_t n, const void* upstream, double factor,
                         cudaStream_t stream);

}  // namespace gpucheck::ssim
