// gpucheck's self-test zoo: the rasterizer's entry points and bindings, in the shape of
// diff-gaussian-rasterization's rasterize_points.cu / ext.cpp. Conventions (not defects):
// "not given" arguments are zero-element CPU placeholders (torch.Tensor([])); the state of
// the forward is three uint8 buffers, allocated empty and grown by resize functions, returned
// for autograd to hand back to the backward (partly uninitialized); cub temp storage lives
// inside them. Defects here (zoo_common.h has the guard ones, zoo_raster.cu the stream ones):
//   GPUCHECK_ZOO_OUTPUT_CURRENT_DEVICE  the image allocated with kCUDA before the guard: on
//                                       the caller's current device
#include "zoo_common.h"
#include "zoo_raster.h"

#include <tuple>

namespace TORCH_EXTENSION_NAME {
namespace {

std::function<char*(size_t)> resizeFunctional(at::Tensor& t) {
  return [&t](size_t n) {
    t.resize_({static_cast<int64_t>(n)});
    return reinterpret_cast<char*>(t.contiguous().data_ptr());
  };
}

RasterArgs args_of(const at::Tensor& background, const at::Tensor& means2D,
                   const at::Tensor& depths, const at::Tensor& sigmas,
                   const at::Tensor& opacities, const at::Tensor& colors_precomp,
                   const at::Tensor& sh_dc, int image_height, int image_width) {
  const int64_t P = means2D.size(0);
  TORCH_CHECK(means2D.dim() == 2 && means2D.size(1) == 2, "means2D must be [P, 2], got ",
              means2D.sizes());
  ZOO_CHECK_CUDA_FLOAT(means2D);
  ZOO_CHECK_CUDA_FLOAT(depths);
  ZOO_CHECK_CUDA_FLOAT(sigmas);
  ZOO_CHECK_CUDA_FLOAT(opacities);
  ZOO_CHECK_CUDA_FLOAT(background);
  TORCH_CHECK(depths.numel() == P && sigmas.numel() == P && opacities.numel() == P,
              "depths, sigmas, opacities must have P = ", P, " elements");
  TORCH_CHECK(background.numel() == 3, "background must be [3], got ", background.sizes());
  TORCH_CHECK(P == 0 || zoo_given(colors_precomp) != zoo_given(sh_dc),
              "give exactly one of colors_precomp and sh_dc (the other: torch.Tensor([]))");
  if (P != 0) {
    const at::Tensor& colors = zoo_given(colors_precomp) ? colors_precomp : sh_dc;
    ZOO_CHECK_CUDA_FLOAT(colors);
    TORCH_CHECK(colors.size(0) == P && colors.numel() == 3 * P, "colors must be [P, 3], got ",
                colors.sizes());
  }
  RasterArgs a;
  a.P = static_cast<int>(P);
  a.width = image_width;
  a.height = image_height;
  a.background = background.data_ptr<float>();
  a.means2D = means2D.data_ptr<float>();
  a.depths = depths.data_ptr<float>();
  a.sigmas = sigmas.data_ptr<float>();
  a.opacities = opacities.data_ptr<float>();
  a.colors = zoo_given(colors_precomp) ? colors_precomp.data_ptr<float>() : nullptr;
  a.sh_dc = zoo_given(sh_dc) ? sh_dc.data_ptr<float>() : nullptr;
  return a;
}

}  // namespace

// (num_rendered, color [3, H, W], radii [P], geomBuffer, binningBuffer, imgBuffer)
std::tuple<int, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
rasterize_gaussians(const at::Tensor& background,      // [3]
                    const at::Tensor& means2D,         // [P, 2]
                    const at::Tensor& depths,          // [P]
                    const at::Tensor& sigmas,          // [P]
                    const at::Tensor& opacities,       // [P, 1]
                    const at::Tensor& colors_precomp,  // [P, 3] or [0]
                    const at::Tensor& sh_dc,           // [P, 3] or [0]
                    int image_height, int image_width) {
#ifdef GPUCHECK_ZOO_OUTPUT_CURRENT_DEVICE
  // Defect: allocated before the guard with kCUDA, i.e. on the caller's current device.
  at::Tensor out_on_current = at::empty({3, image_height, image_width},
                                        at::device(at::kCUDA).dtype(at::kFloat));
#endif
  ZOO_GUARD(means2D);
  const RasterArgs a = args_of(background, means2D, depths, sigmas, opacities, colors_precomp,
                               sh_dc, image_height, image_width);
  const auto float_opts = means2D.options().dtype(at::kFloat);
  at::Tensor out_color = at::empty({3, image_height, image_width}, float_opts);
  at::Tensor radii = at::zeros({a.P}, means2D.options().dtype(at::kInt));
  const auto byte_opts = means2D.options().dtype(at::kByte);
  at::Tensor geomBuffer = at::empty({0}, byte_opts);
  at::Tensor binningBuffer = at::empty({0}, byte_opts);
  at::Tensor imgBuffer = at::empty({0}, byte_opts);
  int rendered = 0;
  if (a.P != 0) {
    rendered = rasterize_forward(a, resizeFunctional(geomBuffer),
                                 resizeFunctional(binningBuffer), resizeFunctional(imgBuffer),
                                 out_color.data_ptr<float>(), radii.data_ptr<int>(),
                                 c10::cuda::getCurrentCUDAStream());
  } else {
    out_color.copy_(background.reshape({3, 1, 1}).expand_as(out_color));
  }
#ifdef GPUCHECK_ZOO_OUTPUT_CURRENT_DEVICE
  out_on_current.copy_(out_color);  // a copy to the caller's current device
  out_color = out_on_current;
#endif
  return {rendered, out_color, radii, geomBuffer, binningBuffer, imgBuffer};
}

// (dL_dcolors [P, 3] or [0], dL_dsh_dc [P, 3] or [0]): the gradient of the colors given
std::tuple<at::Tensor, at::Tensor> rasterize_gaussians_backward(
    const at::Tensor& background,      // [3]
    const at::Tensor& means2D,         // [P, 2]
    const at::Tensor& depths,          // [P]
    const at::Tensor& sigmas,          // [P]
    const at::Tensor& opacities,       // [P, 1]
    const at::Tensor& colors_precomp,  // [P, 3] or [0]
    const at::Tensor& sh_dc,           // [P, 3] or [0]
    const at::Tensor& dL_dout_color,   // [3, H, W]
    int num_rendered,
    const at::Tensor& geomBuffer,      // uint8
    const at::Tensor& binningBuffer,   // uint8
    const at::Tensor& imgBuffer) {     // uint8
  ZOO_GUARD(means2D);
  ZOO_CHECK_CUDA_FLOAT(dL_dout_color);
  const int H = static_cast<int>(dL_dout_color.size(1)), W = static_cast<int>(dL_dout_color.size(2));
  const RasterArgs a = args_of(background, means2D, depths, sigmas, opacities, colors_precomp,
                               sh_dc, H, W);
  at::Tensor dL_dcolor = at::zeros({a.P, 3}, means2D.options());
  if (a.P != 0) {
    rasterize_backward(a, num_rendered, reinterpret_cast<char*>(geomBuffer.data_ptr()),
                       reinterpret_cast<char*>(binningBuffer.data_ptr()),
                       reinterpret_cast<char*>(imgBuffer.data_ptr()),
                       dL_dout_color.data_ptr<float>(), dL_dcolor.data_ptr<float>(),
                       c10::cuda::getCurrentCUDAStream());
  }
  const at::Tensor none = at::empty({0}, means2D.options());
  return zoo_given(colors_precomp) ? std::make_tuple(dL_dcolor, none)
                                   : std::make_tuple(none, dL_dcolor);
}

}  // namespace TORCH_EXTENSION_NAME

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace TORCH_EXTENSION_NAME;
  m.def("rasterize_gaussians", &rasterize_gaussians);
  m.def("rasterize_gaussians_backward", &rasterize_gaussians_backward);
}
