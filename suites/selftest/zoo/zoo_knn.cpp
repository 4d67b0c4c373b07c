// gpucheck's self-test zoo: distCUDA2's entry point and binding in the shape of simple-knn's
// ext.cpp / simple_knn.cu: distCUDA2(points [N, 3]) -> [N] mean squared distance to the 3
// nearest neighbours (3DGS initializes its scales from it). The defects here are the guard
// ones of zoo_common.h (GPUCHECK_ZOO_SET_DEVICE is simple-knn's published fix) and the thrust
// stream of zoo_knn.cu.
#include "zoo_common.h"

namespace TORCH_EXTENSION_NAME {

cudaError_t dist_launch(int n, const float* points, float* mean_dist, cudaStream_t stream);

at::Tensor distCUDA2(const at::Tensor& points) {  // [N, 3]
  ZOO_GUARD(points);
  ZOO_CHECK_CUDA_FLOAT(points);
  TORCH_CHECK(points.dim() == 2 && points.size(1) == 3 && points.size(0) >= 4,
              "points must be [N >= 4, 3], got ", points.sizes());
  at::Tensor mean_dist = at::empty({points.size(0)}, points.options());
  C10_CUDA_CHECK(dist_launch(static_cast<int>(points.size(0)), points.data_ptr<float>(),
                             mean_dist.data_ptr<float>(), c10::cuda::getCurrentCUDAStream()));
  return mean_dist;
}

}  // namespace TORCH_EXTENSION_NAME

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("distCUDA2", &TORCH_EXTENSION_NAME::distCUDA2);
}
