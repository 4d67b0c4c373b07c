// All operator schemas of gpucheck's extension. Kernels register their CUDA implementations
// with TORCH_LIBRARY_IMPL(gpucheck, CUDA, m) in their own entry-point file
// (csrc/<kernel>/<kernel>.cpp); Python calls them as torch.ops.gpucheck.<op>.
#include <torch/library.h>

TORCH_LIBRARY(gpucheck, m) {
  // --- ssim (csrc/ssim) ---
  // --- knn (csrc/knn) ---
}
