// All operator schemas of gpucheck's extension. Kernels register their CUDA implementations
// with TORCH_LIBRARY_IMPL(gpucheck, CUDA, m) in their own entry-point file
// (csrc/<kernel>/<kernel>.cpp); Python calls them as torch.ops.gpucheck.<op>.
#include <Python.h>
#include <torch/library.h>

#include "library.h"

// `import gpucheck._C` loads this library, which registers the ops below; the module itself
// is empty (the pattern of pytorch/extension-cpp).
extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

GPUCHECK_TORCH_LIBRARY(m) {
  // --- ssim (csrc/ssim) ---
  m.def("ssim_forward(Tensor img1, Tensor img2, str padding, str reduction) -> Tensor");
  m.def(
      "ssim_backward(Tensor grad, Tensor img1, Tensor img2, str padding, str reduction, "
      "bool need_grad2) -> (Tensor, Tensor)");
  // The training step with reduction = mean: (mean, grad_scale * d mean / d img1, the same
  // for img2 or an empty [0] tensor), and the in-place scale of such a gradient.
  m.def(
      "ssim_train(Tensor img1, Tensor img2, str padding, float grad_scale, bool need_grad2) "
      "-> (Tensor, Tensor, Tensor)");
  m.def("ssim_scale_(Tensor(a!) grad, Tensor upstream, float factor) -> ()");
  // --- knn (csrc/knn) ---
  m.def("knn_mean_sq_dist(Tensor points, int k=3) -> Tensor");
  // --- splat (csrc/splat): the tile-based Gaussian rasterizer, in two differentiable ops ---
  // splat_project: per Gaussian projection, colour (colors: [N, 3] RGB with sh_degree -1, or
  // SH [N, K, 3] with sh_degree 0..3), validation, memory preflight and tile binning. The
  // Gaussian parameters are float32, bfloat16 or float16 (one dtype), viewmat and K float32;
  // every output float32 / int32. render_opacities / render_background: with 16-bit
  // parameters their float32 copies, which splat_render takes; [0] for float32 parameters.
  m.def(
      "splat_project(Tensor means, Tensor scales, Tensor rotations, Tensor opacities, "
      "Tensor colors, Tensor viewmat, Tensor K, Tensor background, int width, int height, "
      "int sh_degree, int? max_bytes=None) -> (Tensor means2d, Tensor conics, Tensor rgb, "
      "Tensor depths, Tensor radii, Tensor tiles, Tensor tile_ranges, Tensor ids, "
      "Tensor render_opacities, Tensor render_background)");
  // splat_render: per tile compositing of what splat_project returned.
  m.def(
      "splat_render(Tensor means2d, Tensor conics, Tensor opacities, Tensor rgb, "
      "Tensor depths, Tensor background, Tensor tile_ranges, Tensor ids, int width, "
      "int height) -> (Tensor image, Tensor alpha, Tensor depth, Tensor final_T, "
      "Tensor n_contrib)");
  // Float atomics sum the per-Gaussian gradients in an order that varies between runs: the
  // tag tells gpucheck's numerics detector (and torch) that its bits may differ.
  m.def(
      static_cast<const char*>(
      "splat_render_backward(Tensor means2d, Tensor conics, Tensor opacities, Tensor rgb, "
      "Tensor depths, Tensor background, Tensor tile_ranges, Tensor ids, Tensor alpha, "
      "Tensor depth, Tensor final_T, Tensor n_contrib, Tensor grad_image, Tensor grad_alpha, "
      "Tensor grad_depth, int width, int height) -> (Tensor grad_means2d, Tensor grad_conics, "
      "Tensor grad_opacities, Tensor grad_rgb, Tensor grad_depths)"),
      {at::Tag::nondeterministic_bitwise});
  m.def(
      "splat_project_backward(Tensor means, Tensor scales, Tensor rotations, Tensor colors, "
      "Tensor viewmat, Tensor K, Tensor radii, Tensor grad_means2d, Tensor grad_conics, "
      "Tensor grad_rgb, Tensor grad_depths, Tensor grad_opacities, Tensor grad_background, "
      "int width, int height, int sh_degree) -> (Tensor grad_means, Tensor grad_scales, "
      "Tensor grad_rotations, Tensor grad_colors, Tensor grad_opacities, "
      "Tensor grad_background)");
}
