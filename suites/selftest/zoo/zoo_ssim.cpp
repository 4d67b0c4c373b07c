// gpucheck's self-test zoo: the entry points and bindings of an SSIM loss in the shape of
// fused-ssim's ext.cpp / ssim.cu: fusedssim(C1, C2, img1, img2, train) returns the map and,
// when training, the three partial-derivative maps the backward needs; in evaluation those
// are zero-element CPU placeholders (torch::empty(0)), a convention, not a defect. The images
// come in any layout (a permuted HWC render, a channels-last batch): each entry point reads
// a contiguous copy.
// Defects here (zoo_common.h has the guard ones, zoo_ssim.cu the stream and barrier ones):
//   GPUCHECK_ZOO_OUTPUT_CURRENT_DEVICE  the map allocated with kCUDA before the guard: on the
//                                       caller's current device
//   GPUCHECK_ZOO_ASSUME_CONTIGUOUS      the backward reads the images the forward saved as they
//                                       come, as if contiguous: a permuted image's gradient is
//                                       silently wrong
#include "zoo_common.h"

#include <tuple>

namespace TORCH_EXTENSION_NAME {

cudaError_t ssim_forward_launch(int planes, int height, int width, float C1, float C2,
                                const float* img1, const float* img2, float* map,
                                float* dm_dmu1, float* dm_dsigma1_sq, float* dm_dsigma12,
                                cudaStream_t stream);
cudaError_t ssim_backward_launch(int planes, int height, int width, const float* img1,
                                 const float* img2, const float* dL_dmap, const float* dm_dmu1,
                                 const float* dm_dsigma1_sq, const float* dm_dsigma12,
                                 float* dL_dimg1, cudaStream_t stream);

namespace {

// Images of any layout: CUDA, float32, [B, C, H, W], one shape, one device.
void check_images(const at::Tensor& img1, const at::Tensor& img2) {
  for (const at::Tensor* t : {&img1, &img2}) {
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == at::kFloat,
                "img1 and img2 must be float32 CUDA tensors, got ", t->options());
  }
  TORCH_CHECK(img1.dim() == 4 && img1.sizes() == img2.sizes(),
              "img1 and img2 must be [B, C, H, W] of one shape, got ", img1.sizes(), " and ",
              img2.sizes());
  TORCH_CHECK(img1.device() == img2.device(), "img1 and img2 must be on one device, got ",
              img1.device(), " and ", img2.device());
}

}  // namespace

// (ssim_map [B, C, H, W], dm_dmu1, dm_dsigma1_sq, dm_dsigma12: [B, C, H, W], or [0] on the
// CPU when not training)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fusedssim(
    double C1, double C2,
    const at::Tensor& img1,  // [B, C, H, W]
    const at::Tensor& img2,  // [B, C, H, W]
    bool train) {
#ifdef GPUCHECK_ZOO_OUTPUT_CURRENT_DEVICE
  // Defect: allocated before the guard with kCUDA, i.e. on the caller's current device.
  at::Tensor map_on_current = at::empty(img1.sizes(), at::device(at::kCUDA).dtype(at::kFloat));
#endif
  ZOO_GUARD(img1);
  check_images(img1, img2);
  const at::Tensor x = img1.contiguous(), y = img2.contiguous();
  at::Tensor map = at::empty_like(x);
  at::Tensor dm_dmu1 = train ? at::empty_like(x) : torch::empty(0);
  at::Tensor dm_dsigma1_sq = train ? at::empty_like(x) : torch::empty(0);
  at::Tensor dm_dsigma12 = train ? at::empty_like(x) : torch::empty(0);
  C10_CUDA_CHECK(ssim_forward_launch(
      static_cast<int>(x.size(0) * x.size(1)), static_cast<int>(x.size(2)),
      static_cast<int>(x.size(3)), static_cast<float>(C1), static_cast<float>(C2),
      x.data_ptr<float>(), y.data_ptr<float>(), map.data_ptr<float>(),
      train ? dm_dmu1.data_ptr<float>() : nullptr,
      train ? dm_dsigma1_sq.data_ptr<float>() : nullptr,
      train ? dm_dsigma12.data_ptr<float>() : nullptr, c10::cuda::getCurrentCUDAStream()));
#ifdef GPUCHECK_ZOO_OUTPUT_CURRENT_DEVICE
  map_on_current.copy_(map);  // a copy to the caller's current device
  map = map_on_current;
#endif
  return {map, dm_dmu1, dm_dsigma1_sq, dm_dsigma12};
}

// dL/dimg1 [B, C, H, W]
at::Tensor fusedssim_backward(double C1, double C2,
                              const at::Tensor& img1,           // [B, C, H, W]
                              const at::Tensor& img2,           // [B, C, H, W]
                              const at::Tensor& dL_dmap,        // [B, C, H, W]
                              const at::Tensor& dm_dmu1,        // [B, C, H, W]
                              const at::Tensor& dm_dsigma1_sq,  // [B, C, H, W]
                              const at::Tensor& dm_dsigma12) {  // [B, C, H, W]
  (void)C1;
  (void)C2;
  ZOO_GUARD(img1);
  check_images(img1, img2);
  for (const at::Tensor* t : {&dL_dmap, &dm_dmu1, &dm_dsigma1_sq, &dm_dsigma12}) {
    ZOO_CHECK_CUDA_FLOAT(*t);
    TORCH_CHECK(t->sizes() == img1.sizes(), "the backward's maps must be ", img1.sizes(),
                ", got ", t->sizes(), " (was the forward run with train=True?)");
  }
#ifdef GPUCHECK_ZOO_ASSUME_CONTIGUOUS
  const at::Tensor& x = img1;  // Defect: the saved images' strides ignored below
  const at::Tensor& y = img2;
#else
  const at::Tensor x = img1.contiguous(), y = img2.contiguous();
#endif
  at::Tensor dL_dimg1 = at::empty(img1.sizes(), img1.options());
  C10_CUDA_CHECK(ssim_backward_launch(
      static_cast<int>(x.size(0) * x.size(1)), static_cast<int>(x.size(2)),
      static_cast<int>(x.size(3)), x.data_ptr<float>(), y.data_ptr<float>(),
      dL_dmap.data_ptr<float>(), dm_dmu1.data_ptr<float>(), dm_dsigma1_sq.data_ptr<float>(),
      dm_dsigma12.data_ptr<float>(), dL_dimg1.data_ptr<float>(),
      c10::cuda::getCurrentCUDAStream()));
  return dL_dimg1;
}

}  // namespace TORCH_EXTENSION_NAME

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace TORCH_EXTENSION_NAME;
  m.def("fusedssim", &fusedssim, py::arg("C1"), py::arg("C2"), py::arg("img1"), py::arg("img2"),
        py::arg("train"));
  m.def("fusedssim_backward", &fusedssim_backward, py::arg("C1"), py::arg("C2"), py::arg("img1"),
        py::arg("img2"), py::arg("dL_dmap"), py::arg("dm_dmu1"), py::arg("dm_dsigma1_sq"),
        py::arg("dm_dsigma12"));
}
