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
  // --- knn (csrc/knn) ---
  m.def("knn_mean_sq_dist(Tensor points, int k=3) -> Tensor");
  // --- splat (csrc/splat): forward of the tile-based Gaussian rasterizer ---
  // colors: [N, 3] RGB with sh_degree -1, or SH [N, K, 3] with sh_degree 0..3.
  m.def(
      "splat_forward(Tensor means, Tensor scales, Tensor rotations, Tensor opacities, "
      "Tensor colors, Tensor viewmat, Tensor K, Tensor background, int width, int height, "
      "int sh_degree, int? max_bytes=None) -> (Tensor image, Tensor alpha, Tensor depth, "
      "Tensor radii, Tensor n_intersections)");
}
