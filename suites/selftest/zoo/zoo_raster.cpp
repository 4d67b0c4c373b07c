// gpucheck's self-test zoo: the rasterizer's entry points and bindings, in the shape of
// diff-gaussian-rasterization's rasterize_points.cu / ext.cpp. Conventions (not defects):
// "not given" arguments are zero-element CPU placeholders (torch.Tensor([])); the state of
// the forward is three uint8 buffers, allocated empty and grown by resize functions, returned
// for autograd to hand back to the backward (partly uninitialized); cub temp storage lives
// inside them; the projection leaves a culled Gaussian's entries unwritten, its radius 0
// saying so (gsplat's way). Defects here (zoo_common.h has the guard ones, zoo_raster.cu the
// stream ones and the masked tiles'):
//   GPUCHECK_ZOO_OUTPUT_CURRENT_DEVICE  the image allocated with kCUDA before the guard: on
//                                       the caller's current device
//   GPUCHECK_ZOO_ASSUME_CONTIGUOUS      the backward reads the image's gradient as if it were
//                                       contiguous (a loss computed on a permuted view hands
//                                       it in with other strides)
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
                   const at::Tensor& sh_dc, int image_height, int image_width,
                   const at::Tensor& tile_mask) {
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
  if (zoo_given(tile_mask)) {
    const int64_t ty = (image_height + kTile - 1) / kTile, tx = (image_width + kTile - 1) / kTile;
    TORCH_CHECK(tile_mask.is_cuda() && tile_mask.scalar_type() == at::kBool &&
                    tile_mask.is_contiguous() && tile_mask.device() == means2D.device(),
                "tile_mask must be a contiguous bool tensor on ", means2D.device(), ", got ",
                tile_mask.options());
    TORCH_CHECK(tile_mask.dim() == 2 && tile_mask.size(0) == ty && tile_mask.size(1) == tx,
                "tile_mask must be [", ty, ", ", tx, "] (tiles of ", kTile, " pixels), got ",
                tile_mask.sizes());
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
  a.tile_mask = zoo_given(tile_mask) ? tile_mask.data_ptr<bool>() : nullptr;
  return a;
}

}  // namespace

// (num_rendered, color [3, H, W], radii [P], geomBuffer, binningBuffer, imgBuffer,
//  alpha [H, W], last_ids [H, W] int32)
std::tuple<int, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor>
rasterize_gaussians(const at::Tensor& background,      // [3]
                    const at::Tensor& means2D,         // [P, 2]
                    const at::Tensor& depths,          // [P]
                    const at::Tensor& sigmas,          // [P]
                    const at::Tensor& opacities,       // [P, 1]
                    const at::Tensor& colors_precomp,  // [P, 3] or [0]
                    const at::Tensor& sh_dc,           // [P, 3] or [0]
                    int image_height, int image_width,
                    const at::Tensor& tile_mask) {     // [tiles_y, tiles_x] bool or [0]
#ifdef GPUCHECK_ZOO_OUTPUT_CURRENT_DEVICE
  // Defect: allocated before the guard with kCUDA, i.e. on the caller's current device.
  at::Tensor out_on_current = at::empty({3, image_height, image_width},
                                        at::device(at::kCUDA).dtype(at::kFloat));
#endif
  ZOO_GUARD(means2D);
  const RasterArgs a = args_of(background, means2D, depths, sigmas, opacities, colors_precomp,
                               sh_dc, image_height, image_width, tile_mask);
  const auto float_opts = means2D.options().dtype(at::kFloat);
  at::Tensor out_color = at::empty({3, image_height, image_width}, float_opts);
  at::Tensor out_alpha = at::empty({image_height, image_width}, float_opts);
  at::Tensor last_ids = at::empty({image_height, image_width}, means2D.options().dtype(at::kInt));
  at::Tensor radii = at::zeros({a.P}, means2D.options().dtype(at::kInt));
  const auto byte_opts = means2D.options().dtype(at::kByte);
  at::Tensor geomBuffer = at::empty({0}, byte_opts);
  at::Tensor binningBuffer = at::empty({0}, byte_opts);
  at::Tensor imgBuffer = at::empty({0}, byte_opts);
  int rendered = 0;
  if (a.P != 0) {
    rendered = rasterize_forward(a, resizeFunctional(geomBuffer),
                                 resizeFunctional(binningBuffer), resizeFunctional(imgBuffer),
                                 out_color.data_ptr<float>(), out_alpha.data_ptr<float>(),
                                 last_ids.data_ptr<int>(), radii.data_ptr<int>(),
                                 c10::cuda::getCurrentCUDAStream());
  } else {
    out_color.copy_(background.reshape({3, 1, 1}).expand_as(out_color));
    out_alpha.zero_();
    last_ids.fill_(-1);
  }
#ifdef GPUCHECK_ZOO_OUTPUT_CURRENT_DEVICE
  out_on_current.copy_(out_color);  // a copy to the caller's current device
  out_color = out_on_current;
#endif
  return {rendered, out_color, radii, geomBuffer, binningBuffer, imgBuffer, out_alpha, last_ids};
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
    const at::Tensor& imgBuffer,       // uint8
    const at::Tensor& tile_mask) {     // [tiles_y, tiles_x] bool or [0]
  ZOO_GUARD(means2D);
  TORCH_CHECK(dL_dout_color.is_cuda() && dL_dout_color.scalar_type() == at::kFloat &&
                  dL_dout_color.dim() == 3 && dL_dout_color.size(0) == 3,
              "dL_dout_color must be a [3, H, W] float32 CUDA tensor, got ",
              dL_dout_color.sizes(), " ", dL_dout_color.options());
#ifdef GPUCHECK_ZOO_ASSUME_CONTIGUOUS
  const at::Tensor& dL_dout = dL_dout_color;  // Defect: its strides ignored below
#else
  const at::Tensor dL_dout = dL_dout_color.contiguous();
#endif
  const int H = static_cast<int>(dL_dout.size(1)), W = static_cast<int>(dL_dout.size(2));
  const RasterArgs a = args_of(background, means2D, depths, sigmas, opacities, colors_precomp,
                               sh_dc, H, W, tile_mask);
  at::Tensor dL_dcolor = at::zeros({a.P, 3}, means2D.options());
  if (a.P != 0) {
    rasterize_backward(a, num_rendered, reinterpret_cast<char*>(geomBuffer.data_ptr()),
                       reinterpret_cast<char*>(binningBuffer.data_ptr()),
                       reinterpret_cast<char*>(imgBuffer.data_ptr()),
                       dL_dout.data_ptr<float>(), dL_dcolor.data_ptr<float>(),
                       c10::cuda::getCurrentCUDAStream());
  }
  const at::Tensor none = at::empty({0}, means2D.options());
  return zoo_given(colors_precomp) ? std::make_tuple(dL_dcolor, none)
                                   : std::make_tuple(none, dL_dcolor);
}

// (means2D [P, 2], depths [P], conics [P, 3], radii [P] int32): a culled Gaussian (radius 0)
// has its means2D, depth and conic never written (at::empty), as in gsplat's projection
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> project_gaussians(
    const at::Tensor& means3D,     // [P, 3]
    const at::Tensor& log_scales,  // [P, 3]
    double focal, int image_height, int image_width) {
  ZOO_GUARD(means3D);
  ZOO_CHECK_CUDA_FLOAT(means3D);
  ZOO_CHECK_CUDA_FLOAT(log_scales);
  const int64_t P = means3D.size(0);
  TORCH_CHECK(means3D.dim() == 2 && means3D.size(1) == 3, "means3D must be [P, 3], got ",
              means3D.sizes());
  TORCH_CHECK(log_scales.sizes() == means3D.sizes(), "log_scales must be [P, 3], got ",
              log_scales.sizes());
  TORCH_CHECK(log_scales.device() == means3D.device(), "log_scales must be on ",
              means3D.device(), ", got ", log_scales.device());
  at::Tensor means2D = at::empty({P, 2}, means3D.options());
  at::Tensor depths = at::empty({P}, means3D.options());
  at::Tensor conics = at::empty({P, 3}, means3D.options());
  at::Tensor radii = at::empty({P}, means3D.options().dtype(at::kInt));
  if (P != 0) {
    ProjectArgs a;
    a.P = static_cast<int>(P);
    a.width = image_width;
    a.height = image_height;
    a.focal = static_cast<float>(focal);
    a.means3D = means3D.data_ptr<float>();
    a.log_scales = log_scales.data_ptr<float>();
    project_forward(a, means2D.data_ptr<float>(), depths.data_ptr<float>(),
                    conics.data_ptr<float>(), radii.data_ptr<int>(),
                    c10::cuda::getCurrentCUDAStream());
  }
  return {means2D, depths, conics, radii};
}

}  // namespace TORCH_EXTENSION_NAME

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace TORCH_EXTENSION_NAME;
  m.def("rasterize_gaussians", &rasterize_gaussians);
  m.def("rasterize_gaussians_backward", &rasterize_gaussians_backward);
  m.def("project_gaussians", &project_gaussians);
}
