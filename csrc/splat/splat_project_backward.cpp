// Entry point of splat_project_backward (its schema at the end): from d loss / d (means2d,
// conics, rgb, depths) to d loss / d (means, scales, rotations, colours or SH), and with 16-bit
// parameters the opacities' and background's (from the float32 copies render took), every
// gradient in the parameters' dtype. Device guard,
// input checks, outputs from the caching allocator, one launch on the current stream (kernel:
// splat_backward.cu).
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "common.h"
#include "library.h"
#include "splat/splat.h"
#include "splat/splat_checks.h"

namespace gpucheck::splat {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
splat_project_backward_cuda(
    const at::Tensor& means, const at::Tensor& scales, const at::Tensor& rotations,
    const at::Tensor& colors, const at::Tensor& viewmat,
    const at::Tensor& K,              // as splat_project's inputs
    const at::Tensor& radii,          // [N] int32, splat_project's output
    const at::Tensor& grad_means2d,   // [N, 2] float32
    const at::Tensor& grad_conics,    // [N, 3] float32
    const at::Tensor& grad_rgb,       // [N, 3] float32
    const at::Tensor& grad_depths,    // [N] float32
    // 16-bit parameters: d loss / d splat_project's float32 opacities [N] and background [3]
    // (render's inputs then); float32 parameters: [0] each (render took the parameters)
    const at::Tensor& grad_opacities, const at::Tensor& grad_background,
    int64_t width, int64_t height, int64_t sh_degree) {
  constexpr const char* op = "splat_project_backward";
  check_cuda(means, op, "means");
  GPUCHECK_DEVICE_GUARD(means);
  const Scalar scalar = parameter_scalar(means, op);
  const at::ScalarType dt = means.scalar_type();
  const bool half = scalar != Scalar::kFloat32;
  const std::string like = same_dtype_as_means(means);
  check_tensor(means, means, "means", {-1, 3}, op, dt);
  const int64_t n = means.size(0);
  check_tensor(means, scales, "scales", {n, 3}, op, dt, "means", like);
  check_tensor(means, rotations, "rotations", {n, 4}, op, dt, "means", like);
  check_tensor(means, viewmat, "viewmat", {4, 4}, op, at::kFloat, "means", kCameraDtype);
  check_tensor(means, K, "K", {3, 3}, op, at::kFloat, "means", kCameraDtype);
  check_tensor(means, radii, "radii", {n}, op, at::kInt);
  check_tensor(means, grad_means2d, "grad_means2d", {n, 2}, op);
  check_tensor(means, grad_conics, "grad_conics", {n, 3}, op);
  check_tensor(means, grad_rgb, "grad_rgb", {n, 3}, op);
  check_tensor(means, grad_depths, "grad_depths", {n}, op);
  check_tensor(means, grad_opacities, "grad_opacities", {half ? n : 0}, op);
  check_tensor(means, grad_background, "grad_background", {half ? 3 : 0}, op);
  TORCH_CHECK_VALUE(sh_degree >= -1 && sh_degree <= kMaxShDegree, op,
                    ": sh_degree must be -1 (colors are RGB) or in 0..", kMaxShDegree, ", got ",
                    sh_degree);
  TORCH_CHECK_VALUE(width >= 1 && width <= kMaxImageSide && height >= 1 &&
                        height <= kMaxImageSide,
                    op, ": width and height must be in [1, ", kMaxImageSide, "], got ", width,
                    "x", height);
  int64_t sh_coeffs = 0;
  if (sh_degree < 0) {
    check_tensor(means, colors, "colors", {n, 3}, op, dt, "means", like);
  } else {
    check_tensor(means, colors, "sh", {n, -1, 3}, op, dt, "means", like);
    sh_coeffs = colors.size(1);
    TORCH_CHECK_VALUE(sh_coeffs >= (sh_degree + 1) * (sh_degree + 1), op, ": sh_degree ",
                      sh_degree, " needs ", (sh_degree + 1) * (sh_degree + 1),
                      " coefficients per channel, got sh of shape ", colors.sizes());
  }
  // every gradient in the parameters' dtype
  at::Tensor g_means = at::empty_like(means);
  at::Tensor g_scales = at::empty_like(scales);
  at::Tensor g_rotations = at::empty_like(rotations);
  at::Tensor g_colors = at::empty_like(colors);
  at::Tensor g_opacities = at::empty({half ? n : 0}, means.options());
  at::Tensor g_background = at::empty({half ? 3 : 0}, means.options());
  if (n == 0) {
    if (half) g_background = grad_background.to(dt);
    return {g_means, g_scales, g_rotations, g_colors, g_opacities, g_background};
  }
  ProjectGrads g{};
  g.scalar = scalar;
  g.means = means.const_data_ptr();
  g.scales = scales.const_data_ptr();
  g.rotations = rotations.const_data_ptr();
  g.colors = colors.const_data_ptr();
  g.viewmat = viewmat.const_data_ptr<float>();
  g.intrinsics = K.const_data_ptr<float>();
  g.radii = radii.const_data_ptr<int32_t>();
  g.g_means2d = grad_means2d.const_data_ptr<float>();
  g.g_conics = grad_conics.const_data_ptr<float>();
  g.g_rgb = grad_rgb.const_data_ptr<float>();
  g.g_depths = grad_depths.const_data_ptr<float>();
  g.n = static_cast<int>(n);
  g.sh_degree = static_cast<int>(sh_degree);
  g.sh_coeffs = static_cast<int>(sh_coeffs);
  g.width = static_cast<int>(width);
  g.height = static_cast<int>(height);
  g.g_means = g_means.data_ptr();
  g.g_scales = g_scales.data_ptr();
  g.g_rotations = g_rotations.data_ptr();
  g.g_colors = g_colors.data_ptr();
  g.g_opacities_f32 = half ? grad_opacities.const_data_ptr<float>() : nullptr;
  g.g_background_f32 = half ? grad_background.const_data_ptr<float>() : nullptr;
  g.g_opacities = half ? g_opacities.data_ptr() : nullptr;
  g.g_background = half ? g_background.data_ptr() : nullptr;
  launch_project_backward(g, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {g_means, g_scales, g_rotations, g_colors, g_opacities, g_background};
}

// The schemas of its ops.
GPUCHECK_TORCH_LIBRARY_FRAGMENT(m) {
  m.def(
      "splat_project_backward(Tensor means, Tensor scales, Tensor rotations, Tensor colors, "
      "Tensor viewmat, Tensor K, Tensor radii, Tensor grad_means2d, Tensor grad_conics, "
      "Tensor grad_rgb, Tensor grad_depths, Tensor grad_opacities, Tensor grad_background, "
      "int width, int height, int sh_degree) -> (Tensor grad_means, Tensor grad_scales, "
      "Tensor grad_rotations, Tensor grad_colors, Tensor grad_opacities, "
      "Tensor grad_background)");
}

// Through the macro (library.h): a defect build registers under its own namespace.
GPUCHECK_TORCH_LIBRARY_IMPL(CUDA, m) {
  m.impl("splat_project_backward", &splat_project_backward_cuda);
}

}  // namespace gpucheck::splat
